"""Served models across the nodes of a real multi-node Slurm (each node a namespace, real
HTTP between them): `haico serve` from the login node puts a model and a judge on compute
nodes; a campaign job on another node attaches to both by name through the catalogue, its
backend reaching the model under a `vllm` name with the key; a model job requeued onto
another node is found there by the next attempt, and the identity gate holds meanwhile;
renewal hands over to a successor on another node; a campaign that `haico submit` sends
from a shell without CLUSTER_WORK attaches in the project's catalogue."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_haico.errors import CatalogueError
from pytest_haico.serve.catalogue import read_entry
from pytest_haico.serve.resolver import ServedModel, resolve_served
from pytest_haico.submit.inputs import newest_submission
from pytest_haico.submit.journal import Journal
from tests.polling import wait_for
from tests.slurm.nodes import LOGIN, MultiNodeCluster, missing_namespace_requirements
from tests.slurm.test_serve_judge import JUDGE_ARM, SCRIPTS


@dataclass
class Site:
    """A `haico init` project on the shared file system, its CLUSTER_WORK (None: none, so
    the catalogue and results are the project's own), and the cluster."""

    root: Path
    work: Path | None
    cluster: MultiNodeCluster

    @property
    def catalogue(self) -> Path:
        return (self.work or self.root) / "catalogue"

    @property
    def results(self) -> Path:
        return (self.work or self.root) / "results" / "default"

    def env(self) -> dict[str, str]:
        work = {"CLUSTER_WORK": str(self.work)} if self.work else {}
        return {**work, "PYTEST_HAICO_CONCURRENCY": "1"}

    def haico(self, *args: str, node: str = LOGIN) -> subprocess.CompletedProcess[str]:
        """`haico ...` as a user runs it on `node` (the login node by default)."""
        return self.cluster.run_on(
            node, sys.executable, "-m", "pytest_haico", *args, env=self.env(), cwd=self.root
        )

    def serve(self, *args: str) -> str:
        """`haico serve ...` from the login node; the model job's id."""
        done = self.haico("serve", *args, "--profile", "local", "--time", "5")
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout.split("submitted job ", 1)[1].split()[0]

    def campaign(self, node: str, *args: str, name: str = "c") -> str:
        """A campaign job (pytest of the project, campaign exits) pinned to `node`, submitted
        from the login node; its id."""
        pytest_argv = [sys.executable, "-m", "pytest", "experiments", "-p", "no:cacheprovider",
                       "--haico-exit", "campaign", *args]  # fmt: skip
        done = self.cluster.run_on(
            LOGIN, "sbatch", "--parsable", "-w", node, f"--output={self.root / name}.%j.out",
            f"--chdir={self.root}", "--export=ALL", "--wrap", " ".join(pytest_argv),
            env=self.env(), check=True,
        )  # fmt: skip
        return done.stdout.strip()

    def output(self, job: str, name: str = "c") -> str:
        path = self.root / f"{name}.{job}.out"
        return path.read_text()[-4000:] if path.exists() else f"(no {path})"

    def records(self, arm: str = "standin") -> list[dict[str, Any]]:
        return [
            json.loads(line)
            for path in sorted((self.results / arm / "ledger").glob("*.jsonl"))
            for line in path.read_text().splitlines()
            if line.strip()
        ]

    def gate(self, run_id: str, name: str) -> dict[str, Any]:
        """The run's first gate of that name (a gate may be listed again in the summary)."""
        path = self.results / "standin" / "runs" / run_id / "gates.json"
        found = [g for g in json.loads(path.read_text())["gates"] if g["name"] == name]
        return dict(found[0])

    def run_config(self, run_id: str) -> dict[str, str]:
        path = self.results / "standin" / "runs" / run_id / "run-config.json"
        values: dict[str, str] = json.loads(path.read_text())["values"]
        return values


def _site(
    tmp_path: Path,
    cluster: MultiNodeCluster,
    monkeypatch: pytest.MonkeyPatch,
    *,
    cluster_work: bool = True,
) -> Site:
    root = tmp_path / "project"
    subprocess.run(
        [sys.executable, "-m", "pytest_haico", "init", str(root)], check=True, capture_output=True
    )
    (root / "judges" / "arms").mkdir(parents=True)
    (root / "judges" / "arms" / "judge.toml").write_text(JUDGE_ARM)
    for key, value in cluster.env.items():  # this process resolves entries against Slurm
        monkeypatch.setenv(key, value)
    return Site(root=root, work=tmp_path / "work" if cluster_work else None, cluster=cluster)


def _cancel_all(site: Site) -> None:
    """Cancel every job left in the queue and wait for their ends."""
    jobs = site.cluster.run("squeue", "-h", "-o", "%i").stdout.split()
    for job in jobs:
        site.cluster.run("scancel", job)
    if jobs:
        site.cluster.wait_ended(*jobs, timeout=60)


@contextmanager
def _cleaned(site: Site) -> Iterator[Site]:
    """`site`, and after it: every job it leaves cancelled, every node it drained resumed."""
    try:
        yield site
    finally:
        _cancel_all(site)
        for node in site.cluster.compute:
            if site.cluster.state(node).rstrip("*") in ("drained", "draining", "drain"):
                site.cluster.run("scontrol", "update", f"nodename={node}", "state=resume")


@pytest.fixture
def site(
    tmp_path: Path,
    slurm_nodes: Callable[[int], MultiNodeCluster],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Site]:
    """A project on the shared three-node cluster, CLUSTER_WORK beside it; cleaned after."""
    with _cleaned(_site(tmp_path, slurm_nodes(3), monkeypatch)) as site:
        yield site


@pytest.fixture
def project_site(
    tmp_path: Path,
    slurm_nodes: Callable[[int], MultiNodeCluster],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Site]:
    """A project on the shared three-node cluster without CLUSTER_WORK; cleaned after."""
    with _cleaned(_site(tmp_path, slurm_nodes(3), monkeypatch, cluster_work=False)) as site:
        yield site


def _registered(
    site: Site, name: str, *, job: str | None = None, restarts: int = 0, timeout: float = 180
) -> ServedModel:
    found: list[ServedModel] = []

    def registered() -> bool:
        try:
            served = resolve_served(name, catalogue=site.catalogue)
        except CatalogueError:
            return False
        found.append(served)
        return served.entry.job.restart_count == restarts and job in (None, served.entry.job.id)

    wait_for(registered, timeout=timeout, what=f"{name!r} to register")
    return found[-1]


def _other_node(site: Site, *taken: str) -> str:
    return next(node for node in site.cluster.compute if node not in taken)


def _ended(site: Site, job: str, *, timeout: float = 300) -> str:
    return site.cluster.wait_ended(job, timeout=timeout)[job]


def _reachable_from(site: Site, node: str, served: ServedModel) -> int:
    """The status of `GET /v1/models` with the key, sent from `node`."""
    code = (
        "import sys, urllib.request as u\n"
        "r = u.Request(sys.argv[1], headers={'Authorization': 'Bearer ' + sys.argv[2]})\n"
        "print(u.urlopen(r, timeout=10).status)\n"
    )
    done = site.cluster.run_on(
        node, sys.executable, "-c", code, f"{served.endpoint}/models", served.api_key()
    )
    return int(done.stdout.strip()) if done.returncode == 0 else -1


def test_a_model_and_a_judge_served_on_other_nodes_serve_a_campaign_with_their_keys(
    site: Site,
) -> None:
    (site.root / "experiments" / "scripts" / "judged.yaml").write_text(SCRIPTS)
    model_job = site.serve("standin")
    model = _registered(site, "standin", job=model_job)
    judge_job = site.serve("judge", "--experiments", "judges")
    judge = _registered(site, "judge", job=judge_job)
    # Each registers the node it runs on, where every node reaches it with the key.
    assert model.entry.host == model.entry.job.node in site.cluster.compute
    assert judge.entry.host == judge.entry.job.node in site.cluster.compute
    node = _other_node(site, model.entry.job.node, judge.entry.job.node)
    assert _reachable_from(site, node, model) == 200

    job = site.campaign(node, "--haico-model", "standin", "--haico-judge", "judge")
    assert _ended(site, job) == "COMPLETED", site.output(job)
    records = {r["script"]: r for r in site.records()}
    assert {r["slurm"]["node"] for r in records.values()} == {node}
    judged = records.pop("crete-judged")
    assert {r["verdict"] for r in records.values()} == {"completed"}, records
    # The judge on its node answered each question: yes to the first, no to the second.
    verdicts = [turn["expectations"][0] for turn in judged["turns"]]
    assert [(v["passed"], v["judge"]["answer"]) for v in verdicts] == [
        (True, "Yes."),
        (False, "No."),
    ]
    assert {v["judge"]["job_id"] for v in verdicts} == {judge_job}
    run_id = judged["run_id"]
    served_gate = site.gate(run_id, "served_model")
    assert served_gate["passed"], served_gate
    assert f"'standin' at http://{model.entry.host}:{model.entry.port}/v1" in served_gate["detail"]
    # The backend on the campaign's node reached the model through its relay, under a name
    # that says vllm (so that it sends VLLM_API_KEY), and the key arrived (the gates'
    # unauthenticated probe was refused, the canary answered).
    config = site.run_config(run_id)
    assert config["MODEL_ENDPOINT"].startswith("http://vllm.localhost:"), config
    for name in ("api_key", "canary_turn"):
        assert site.gate(run_id, name)["passed"], site.gate(run_id, name)
    relay = site.results / "standin" / "runs" / run_id / "logs" / "model-relay.log"
    assert f"-> {model.entry.host}:{model.entry.port}" in relay.read_text()


def test_a_model_job_requeued_onto_another_node_is_found_there_by_the_next_attempt(
    site: Site,
) -> None:
    """`scontrol requeue` with the model's node drained: the job's run ends (deregistering),
    it runs again on another node, registers there with a new key, and a campaign attempt on
    a third node resolves it there."""
    cluster = site.cluster
    job = site.serve("standin")
    first = _registered(site, "standin", job=job)
    old, first_key = first.entry.job.node, first.api_key()
    cluster.run("scontrol", "update", f"nodename={old}", "state=drain", "reason=test", check=True)
    cluster.run("scontrol", "requeue", job, check=True)
    again = _registered(site, "standin", job=job, restarts=1, timeout=240)
    assert again.entry.host == again.entry.job.node != old
    assert again.api_key() != first_key
    node = _other_node(site, old, again.entry.host)
    assert _reachable_from(site, node, again) == 200
    campaign = site.campaign(node, "--haico-model", "standin")
    assert _ended(site, campaign) == "COMPLETED", site.output(campaign)
    records = site.records()
    assert [r["verdict"] for r in records] == ["completed", "completed"], records
    gate = site.gate(records[0]["run_id"], "served_model")
    assert f"at http://{again.entry.host}:{again.entry.port}/v1, job {job}" in gate["detail"]


@pytest.fixture
def broken_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Site]:
    """A project on a three-node cluster of its own, for a test that breaks a node."""
    reason = missing_namespace_requirements()
    if reason is not None:
        pytest.skip(reason)
    cluster = MultiNodeCluster(tmp_path / "cluster", count=3)
    cluster.start()
    try:
        yield _site(tmp_path, cluster, monkeypatch)
    finally:
        cluster.stop()


def _commands_on(site: Site, node: str) -> list[str]:
    commands = []
    for pid in site.cluster.processes_on(node):
        try:
            commands.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue  # ended meanwhile
    return commands


def test_a_model_job_requeued_off_a_dead_node_is_found_on_its_new_node_and_its_old_run_stops(
    broken_site: Site,
) -> None:
    """The node's slurmd dies: the job's processes live on there, the controller finds the
    node DOWN and requeues the job onto another. Its old entry is refused meanwhile; the new
    run registers with its own key; the old run sees its place taken and stops its server,
    leaving the new entry alone; the next campaign attempt uses the model on its new node."""
    site, cluster = broken_site, broken_site.cluster
    job = site.serve("standin")
    first = _registered(site, "standin", job=job)
    dead = first.entry.job.node
    cluster.kill_slurmd(dead)
    wait_for(
        lambda: cluster.job_fields(job).get("Restarts") == "1",
        timeout=120,
        what=f"Slurm to requeue job {job} off {dead}",
    )
    if read_entry(site.catalogue, "standin").job.restart_count == 0:  # not yet registered again
        with pytest.raises(CatalogueError, match=f"its job {job} (is PENDING|was requeued|runs)"):
            resolve_served("standin", catalogue=site.catalogue)
    again = _registered(site, "standin", job=job, restarts=1, timeout=240)
    assert again.entry.host == again.entry.job.node != dead
    assert again.key_file.name == f"standin.{job}.r1.key" and again.api_key() != first.api_key()

    def old_run_stopped() -> bool:
        left = _commands_on(site, dead)
        return not any("serve.job" in c or "standins" in c for c in left)

    wait_for(old_run_stopped, timeout=60, what=f"the old run on {dead} to stop its server")
    log = (site.catalogue / "logs" / f"standin.{job}.out").read_text()
    assert f"replaced by job {job} itself, requeued onto {again.entry.host} (restart 1)" in log
    assert resolve_served("standin", catalogue=site.catalogue).entry == again.entry
    assert again.key_file.exists()

    node = _other_node(site, dead, again.entry.host)
    campaign = site.campaign(node, "--haico-model", "standin")
    assert _ended(site, campaign) == "COMPLETED", site.output(campaign)
    records = site.records()
    assert [r["verdict"] for r in records] == ["completed", "completed"], records
    gate = site.gate(records[0]["run_id"], "served_model")
    assert f"at http://{again.entry.host}:{again.entry.port}/v1, job {job}" in gate["detail"]
    # The identity gate holds against the model on its new node: an arm that says another
    # configuration is refused before anything starts.
    arm = site.root / "experiments" / "arms" / "standin.toml"
    arm.write_text(arm.read_text().replace("max_model_len = 8192", "max_model_len = 4096"))
    refused = cluster.run_on(
        node, sys.executable, "-m", "pytest", "experiments", "-p", "no:cacheprovider",
        "--haico-exit", "campaign", "--haico-model", "standin", env=site.env(), cwd=site.root,
    )  # fmt: skip
    assert refused.returncode == 78, refused.stdout[-3000:]
    assert "vllm.max_model_len: served 8192, the arm's 4096" in refused.stdout, refused.stdout


def _queued_successor(log: Path) -> str:
    said: list[str] = []

    def queued() -> bool:
        said[:] = (log.read_text() if log.exists() else "").split("renewal: queued job ", 1)[1:]
        return bool(said)

    wait_for(queued, timeout=120, what=f"{log.name} to queue its successor")
    return said[0].split()[0]


def test_a_renewed_model_job_hands_over_to_its_successor_on_another_node(site: Site) -> None:
    """--time 3 --until 10 --renew-lead 2: the successor starts a minute after the first job,
    on the least loaded node (the partition is LLN), registers there, and the first drains;
    a campaign on a third node then uses the successor."""
    logs = site.catalogue / "logs"
    done = site.haico(
        "serve", "standin", "--profile", "local", "--time", "3", "--until", "10",
        "--renew-lead", "2",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    first_job = done.stdout.split("submitted job ", 1)[1].split()[0]
    first = _registered(site, "standin", job=first_job)
    second_job = _queued_successor(logs / f"standin.{first_job}.out")
    second = _registered(site, "standin", job=second_job, timeout=240)
    assert second.entry.host == second.entry.job.node != first.entry.job.node
    assert _ended(site, first_job, timeout=120) == "COMPLETED"
    first_log = (logs / f"standin.{first_job}.out").read_text()
    assert f"stopped (replaced by job {second_job})" in first_log, first_log

    node = _other_node(site, first.entry.job.node, second.entry.job.node)
    campaign = site.campaign(node, "--haico-model", "standin")
    assert _ended(site, campaign) == "COMPLETED", site.output(campaign)
    records = site.records()
    assert [r["verdict"] for r in records] == ["completed", "completed"], records
    assert {r["slurm"]["node"] for r in records} == {node}
    gate = site.gate(records[0]["run_id"], "served_model")
    assert (
        f"at http://{second.entry.host}:{second.entry.port}/v1, job {second_job}" in gate["detail"]
    )


def test_a_campaign_submitted_without_cluster_work_attaches_in_the_projects_catalogue(
    project_site: Site,
) -> None:
    """No CLUSTER_WORK anywhere: `haico serve` from the login node registers the model in
    `<project>/catalogue`; `haico submit` from there gives its jobs that catalogue, and their
    tasks on the compute nodes attach to the model by name (they looked in their frozen copy
    of the inputs before, and stopped at gate served_model)."""
    site = project_site
    arm = site.root / "experiments" / "arms" / "standin.toml"
    served = site.root / "served"
    (served / "arms").mkdir(parents=True)
    (served / "scripts").mkdir()
    (served / "arms" / "standin.toml").write_text(arm.read_text())
    arm.write_text(arm.read_text().replace("[model]\n", '[model]\nserved = "standin"\n', 1))
    model_job = site.serve("standin", "--experiments", "served")
    model = _registered(site, "standin", job=model_job)
    assert site.catalogue == site.root / "catalogue"

    done = site.haico("submit", "default", "--stage", "smoke")
    assert done.returncode == 0, done.stdout + done.stderr
    submission = newest_submission(site.results)
    assert submission.catalogue == site.catalogue
    jobs = [str(job.job_id) for job in Journal(submission.journal).read(warn=print).values()]
    ends = site.cluster.wait_ended(*jobs, timeout=300)
    logs = "".join(log.read_text()[-2000:] for log in sorted(submission.logs.iterdir()))
    assert jobs and set(ends.values()) == {"COMPLETED"}, (ends, logs)
    records = site.records()
    assert records and {r["verdict"] for r in records} == {"completed"}, records
    for run_id in {r["run_id"] for r in records}:
        detail = site.gate(run_id, "served_model")["detail"]
        assert f"'standin' at {model.endpoint}, job {model_job}: the arm's model" == detail
