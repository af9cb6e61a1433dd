"""The catalogue of served models: entries and keys written, read with trust checks, resolved
against the job's state, and deregistered by their own job only."""

from __future__ import annotations

import grp
import json
import os
import socket
import stat
import subprocess
from pathlib import Path

import pytest

from pytest_haico.errors import CatalogueError
from pytest_haico.serve.catalogue import (
    CatalogueEntry,
    EntryJob,
    EntryOwner,
    ServedIdentity,
    deregister,
    entry_path,
    key_file_name,
    now_utc,
    read_entry,
    register,
)
from pytest_haico.serve.job import replaced_by
from pytest_haico.serve.resolver import JobLookup, list_served, resolve_served
from pytest_haico.slurm.client import NoAnswer
from pytest_haico.slurm.records import JobRecord

IDENTITY = "path:/models/q;config.json:" + "a" * 64 + ";model.safetensors.index.json:" + "b" * 64
VLLM = {"max_model_len": 8192, "tensor_parallel_size": 1, "tool_call_parser": "hermes"}


def _entry(
    name: str = "judge",
    *,
    job: str = "41",
    restarts: int = 0,
    uid: int | None = None,
    node: str = "gpu07",
) -> CatalogueEntry:
    return CatalogueEntry(
        name=name,
        host=node,
        port=8011,
        served_name="qwen32b",
        identity=ServedIdentity(model=IDENTITY, vllm=VLLM, vllm_version="0.32.0"),
        job=EntryJob(id=job, node=node, restart_count=restarts, end_time=None),
        owner=EntryOwner(uid=os.geteuid() if uid is None else uid, name="me"),
        arm="qwen32b",
        registered_at=now_utc(),
        key_file=key_file_name(name, job, restarts),
    )


def _running(
    job: str = "41", *, state: str = "RUNNING", host: str = "gpu07", restarts: int = 0
) -> JobLookup:
    def lookup(job_id: str) -> JobRecord | None:
        assert job_id == job
        return JobRecord(job_id=job, state=state, batch_host=host, restarts=restarts)

    return lookup


@pytest.fixture
def catalogue(tmp_path: Path) -> Path:
    return tmp_path / "work" / "catalogue"


def _register(catalogue: Path, entry: CatalogueEntry, key: str = "sk-secret") -> Path:
    return register(catalogue, entry, key, file_mode=0o640, key_group=None)


def test_a_registered_model_resolves_to_its_endpoint_name_identity_and_key(catalogue: Path) -> None:
    _register(catalogue, _entry())
    served = resolve_served("judge", catalogue=catalogue, lookup=_running())
    assert served.endpoint == "http://gpu07:8011/v1"
    assert served.served_name == "qwen32b"
    assert served.identity.model == IDENTITY
    assert served.identity.vllm == VLLM and served.identity.vllm_version == "0.32.0"
    assert served.key_file == catalogue / "judge.41.key"
    assert served.api_key() == "sk-secret"


def test_the_entry_is_in_the_results_mode_without_the_key_and_the_key_is_private(
    catalogue: Path,
) -> None:
    path = _register(catalogue, _entry())
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert stat.S_IMODE(catalogue.stat().st_mode) == 0o750
    assert stat.S_IMODE((catalogue / "judge.41.key").stat().st_mode) == 0o600
    assert b"sk-secret" not in path.read_bytes()
    document = json.loads(path.read_bytes())
    assert document["schema"] == 1
    assert document["model"]["config_sha256"] == "a" * 64
    assert document["model"]["shard_index_sha256"] == "b" * 64
    assert document["job"] == {"id": "41", "node": "gpu07", "restart_count": 0, "end_time": None}


@pytest.mark.subprocess
def test_git_never_adds_the_catalogue_in_a_repository(tmp_path: Path) -> None:
    # Without $CLUSTER_WORK the catalogue is <rootdir>/catalogue, inside the experiments'
    # repository: `git add -A` there must not take the served model's key.
    repository = tmp_path / "project"
    repository.mkdir()
    subprocess.run(["git", "init", "-q", str(repository)], check=True)
    catalogue = repository / "catalogue"
    _register(catalogue, _entry())
    assert (catalogue / "judge.41.key").is_file()
    listed = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all", "--ignored=no"],
        cwd=repository,
        capture_output=True,
        text=True,
        check=True,
    )
    assert listed.stdout == ""
    text = (catalogue / ".gitignore").read_text()
    assert text.splitlines()[-1] == "*"


def test_a_key_shared_with_a_group_is_0640_with_that_group(catalogue: Path) -> None:
    group = grp.getgrgid(os.getegid())
    register(catalogue, _entry(), "sk-secret", file_mode=0o640, key_group=group.gr_name)
    key = (catalogue / "judge.41.key").stat()
    assert (stat.S_IMODE(key.st_mode), key.st_gid) == (0o640, group.gr_gid)


def test_an_unknown_group_for_the_key_is_one_line(catalogue: Path) -> None:
    with pytest.raises(CatalogueError, match=r"^SERVE_KEY_GROUP=no-such-group: no such Unix group"):
        register(catalogue, _entry(), "k", file_mode=0o640, key_group="no-such-group")


def test_an_unknown_name_names_what_is_served(catalogue: Path) -> None:
    _register(catalogue, _entry())
    with pytest.raises(CatalogueError) as refused:
        resolve_served("jduge", catalogue=catalogue, lookup=_running())
    assert str(refused.value) == (
        f"no served model named 'jduge' in {catalogue} (served there: judge); start it with "
        "`haico serve <arm> --name jduge`"
    )


def test_a_missing_catalogue_says_nothing_is_served(catalogue: Path) -> None:
    catalogue.parent.mkdir()
    with pytest.raises(CatalogueError, match="no catalogue here: no model is served"):
        resolve_served("judge", catalogue=catalogue, lookup=_running())


def test_a_catalogue_whose_parent_this_host_lacks_says_it_must_be_shared(catalogue: Path) -> None:
    """Not "nothing is served": a place this host cannot see (a path of another node's)."""
    with pytest.raises(CatalogueError) as refused:
        resolve_served("judge", catalogue=catalogue, lookup=_running())
    assert str(refused.value) == (
        f"{catalogue}: no catalogue here: {catalogue.parent} does not exist on "
        f"{socket.gethostname()}: a served model is found only through a catalogue on a file "
        "system shared with the node that serves it (set CLUSTER_WORK, or --haico-catalogue "
        "DIR, to a shared directory)"
    )


@pytest.mark.parametrize(
    ("lookup", "problem"),
    [
        (lambda job: None, "its job 41 has ended (Slurm no longer knows it)"),
        (_running(state="COMPLETED"), "its job 41 is COMPLETED"),
        (_running(state="PENDING"), "its job 41 is PENDING"),
        (
            _running(restarts=1),
            "its job 41 was requeued since it registered (restart 1); it registers again "
            "once its model is healthy",
        ),
        (_running(host="gpu11"), "its job 41 runs on gpu11, not on gpu07 as registered"),
    ],
)
def test_a_stale_entry_is_recognised_by_its_jobs_state(
    catalogue: Path, lookup: JobLookup, problem: str
) -> None:
    _register(catalogue, _entry())
    with pytest.raises(CatalogueError) as refused:
        resolve_served("judge", catalogue=catalogue, lookup=lookup)
    assert str(refused.value) == (
        f"served model 'judge' is not available: {problem} (`haico serve --list` shows what "
        "is served)"
    )


def test_an_entry_is_not_taken_on_trust_when_slurm_cannot_answer(catalogue: Path) -> None:
    _register(catalogue, _entry())

    def silent(job_id: str) -> JobRecord | None:
        raise NoAnswer("scontrol", 10)

    with pytest.raises(CatalogueError, match="Slurm cannot say whether its job 41 runs"):
        resolve_served("judge", catalogue=catalogue, lookup=silent)


def test_a_requeued_job_that_registered_again_resolves_to_its_new_port(catalogue: Path) -> None:
    _register(catalogue, _entry())
    moved = _entry(restarts=1).model_copy(update={"port": 8999})
    _register(catalogue, moved)
    served = resolve_served("judge", catalogue=catalogue, lookup=_running(restarts=1))
    assert served.endpoint == "http://gpu07:8999/v1"


@pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's file needs root")
def test_a_planted_entry_of_another_user_is_refused(catalogue: Path) -> None:
    _register(catalogue, _entry())
    path = entry_path(catalogue, "judge")
    path.write_bytes(_entry(uid=65534).to_json())
    os.chown(path, 65534, 65534)
    with pytest.raises(CatalogueError) as refused:
        resolve_served("judge", catalogue=catalogue, lookup=_running())
    assert str(refused.value) == (
        f"refused catalogue entry: {path} is owned by uid 65534 (nobody), not by uid 0 (root)"
    )


def test_an_entry_claiming_another_owner_is_refused(catalogue: Path) -> None:
    _register(catalogue, _entry(uid=os.geteuid() + 1))
    with pytest.raises(CatalogueError, match=r"claims to be 'judge' of uid \d+, but is 'judge' in"):
        read_entry(catalogue, "judge")


def test_an_entry_others_may_write_is_refused(catalogue: Path) -> None:
    path = _register(catalogue, _entry())
    path.chmod(0o662)
    with pytest.raises(CatalogueError, match=r"is writable by group and others \(mode 0662\)$"):
        read_entry(catalogue, "judge")


def test_a_damaged_entry_is_one_line(catalogue: Path) -> None:
    path = _register(catalogue, _entry())
    path.write_bytes(b'{"name": "judge", "port": "80"')
    with pytest.raises(CatalogueError) as refused:
        read_entry(catalogue, "judge")
    assert str(refused.value).startswith(f"{path} is not a catalogue entry (")
    assert "\n" not in str(refused.value)


def test_a_catalogue_others_may_write_is_refused(catalogue: Path) -> None:
    _register(catalogue, _entry())
    catalogue.chmod(0o777)
    with pytest.raises(CatalogueError) as refused:
        read_entry(catalogue, "judge")
    assert str(refused.value) == (
        f"the catalogue {catalogue} is writable by group and others (mode 0777): it is not "
        "yours alone, so its entries cannot be trusted; use a catalogue directory of your "
        "own (CLUSTER_WORK)"
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_a_catalogue_of_another_user_is_refused(catalogue: Path) -> None:
    _register(catalogue, _entry())
    os.chown(catalogue, 65534, 65534)
    with pytest.raises(CatalogueError, match=r"is owned by uid 65534 \(nobody\), not by uid 0"):
        read_entry(catalogue, "judge")


def test_a_catalogue_that_is_a_symlink_is_refused(catalogue: Path, tmp_path: Path) -> None:
    _register(catalogue, _entry())
    link = tmp_path / "linked"
    link.symlink_to(catalogue)
    with pytest.raises(CatalogueError, match=r"linked is a symbolic link: it is not yours"):
        read_entry(link, "judge")


def test_a_key_file_others_may_read_is_refused(catalogue: Path) -> None:
    _register(catalogue, _entry())
    (catalogue / "judge.41.key").chmod(0o644)
    served = resolve_served("judge", catalogue=catalogue, lookup=_running())
    with pytest.raises(CatalogueError, match=r"judge\.41\.key is readable by others"):
        served.api_key()


def test_deregistering_removes_only_the_own_jobs_entry(catalogue: Path) -> None:
    _register(catalogue, _entry(job="41"))
    _register(catalogue, _entry(job="42"), key="sk-successor")  # the successor registered
    assert not deregister(catalogue, "judge", job_id="41")
    assert read_entry(catalogue, "judge").job.id == "42"
    assert sorted(p.name for p in catalogue.iterdir()) == [
        ".gitignore",
        "judge.42.key",
        "judge.json",
    ]
    assert deregister(catalogue, "judge", job_id="42")
    assert [p.name for p in catalogue.iterdir()] == [".gitignore"]


def test_an_earlier_run_of_a_requeued_job_leaves_the_later_runs_entry_and_key(
    catalogue: Path,
) -> None:
    """Slurm requeued job 41 from gpu07, whose slurmd stopped answering, onto gpu08, while its
    first run lived on: when that run ends, the entry and key of the run on gpu08 stay."""
    _register(catalogue, _entry(job="41"), key="sk-first")
    _register(catalogue, _entry(job="41", restarts=1, node="gpu08"), key="sk-again")
    assert sorted(p.name for p in catalogue.iterdir()) == [
        ".gitignore",  # the catalogue keeps its keys out of git
        "judge.41.key",
        "judge.41.r1.key",
        "judge.json",
    ]
    assert not deregister(catalogue, "judge", job_id="41", restart_count=0)
    served = resolve_served("judge", catalogue=catalogue, lookup=_running(host="gpu08", restarts=1))
    assert (served.entry.host, served.api_key()) == ("gpu08", "sk-again")
    assert deregister(catalogue, "judge", job_id="41", restart_count=1)
    assert [p.name for p in catalogue.iterdir()] == [".gitignore"]


def test_the_listing_says_which_entries_are_usable(catalogue: Path) -> None:
    _register(catalogue, _entry("judge", job="41"))
    _register(catalogue, _entry("gen", job="7"))
    (catalogue / "broken.json").write_bytes(b"[]")

    def lookup(job_id: str) -> JobRecord | None:
        return (
            JobRecord(job_id=job_id, state="RUNNING", batch_host="gpu07")
            if job_id == "41"
            else None
        )

    listings = {listing.name: listing for listing in list_served(catalogue, lookup=lookup)}
    assert sorted(listings) == ["broken", "gen", "judge"]
    assert listings["judge"].problem is None
    assert listings["gen"].problem == "its job 7 has ended (Slurm no longer knows it)"
    assert listings["broken"].entry is None
    assert "is not a catalogue entry" in str(listings["broken"].problem)


def test_a_model_job_sees_its_place_taken_by_a_successor_or_its_own_requeued_run(
    catalogue: Path,
) -> None:
    first = _entry(job="41")
    _register(catalogue, first)
    replaced = replaced_by(catalogue, "judge", first.job)
    assert replaced() is None
    _register(catalogue, _entry(job="41", restarts=1, node="gpu08"))
    assert replaced() == "job 41 itself, requeued onto gpu08 (restart 1)"
    _register(catalogue, _entry(job="42"))
    assert replaced() == "job 42"
