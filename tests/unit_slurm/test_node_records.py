"""Where a task ran, as each Slurm output says it, and the nodes of each partition."""

from __future__ import annotations

from pytest_haico.slurm.nodes import parse_partition_nodes
from pytest_haico.slurm.records import TaskState, parse_job_records, parse_sacct_tasks


def test_a_task_ran_on_its_batch_host() -> None:
    [record] = parse_job_records(
        "JobId=13 ArrayJobId=12 ArrayTaskId=1 JobState=NODE_FAIL ExitCode=0:0 "
        "NodeList=hn2 BatchHost=hn2"
    )
    assert record.task_state == TaskState("NODE_FAIL", "0:0", "hn2")


def test_the_job_completion_log_names_the_node_by_its_node_list_alone() -> None:
    [one, several, none] = parse_job_records(
        "JobId=13 JobState=FAILED ExitCode=75:0 NodeList=hn3\n"
        "JobId=14 JobState=FAILED ExitCode=75:0 NodeList=hn[1-2]\n"
        "JobId=15 JobState=PENDING ExitCode=0:0 NodeList=(null)\n"
    )
    assert one.node == "hn3"
    assert several.node is None  # a job of one node is what haico submits
    assert none.node is None


def test_sacct_names_each_tasks_node_and_none_for_a_pending_one() -> None:
    stdout = "9_0|COMPLETED|0:0|hn1\n9_1|NODE_FAIL|0:0|hn2\n9_[2-3]|PENDING|0:0|None assigned\n"
    assert parse_sacct_tasks(stdout, "9") == {
        0: TaskState("COMPLETED", "0:0", "hn1"),
        1: TaskState("NODE_FAIL", "0:0", "hn2"),
        2: TaskState("PENDING", "0:0"),
        3: TaskState("PENDING", "0:0"),
    }


def test_partition_nodes_list_each_node_once_and_the_default_partition_under_its_name_too() -> None:
    stdout = "hn1 debug*\nhn2 debug*\nhn2 gpu\nhn3 gpu\nhn1 debug*\n"
    assert parse_partition_nodes(stdout) == {
        "debug": ("hn1", "hn2"),
        "": ("hn1", "hn2"),
        "gpu": ("hn2", "hn3"),
    }
