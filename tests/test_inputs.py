"""Bad input of every kind gets one clear line naming the file, job or field; exit code 2."""

from __future__ import annotations

import pytest

from hetsched.cli.main import main
from hetsched.core.problem import PlanningProblem
from hetsched.errors import InputError, PlanningError
from hetsched.io.profiles import load_throughputs, parse_csv
from hetsched.io.specs import expand_hostlist, load_cluster, load_jobs, parse_jobs
from hetsched.planning.planner import make_plan
from hetsched.planning.space.policies.base import make_policy, parse_param

JOB = "{name: a, workload: w, dataset_size: 1000, epochs: 1, global_batch: 64}"
CLUSTER = "nodes:\n  - {names: 'v100-[1-2]', gpu_type: v100, gpus: 2}\n"
CSV = ("workload,gpu_type,local_batch,step_time_s\n"
       "w,v100,16,0.05\nw,v100,64,0.11\nw,k80,16,0.2\nw,k80,32,0.35\n")


def jobs_yaml(*items: str) -> str:
    return "jobs:\n" + "".join(f"  - {it}\n" for it in items)


def job(**kw: object) -> str:
    base = {"name": "a", "workload": "w", "dataset_size": 1000, "epochs": 1, "global_batch": 64}
    base.update(kw)
    return "{" + ", ".join(f"{k}: {v}" for k, v in base.items() if v is not None) + "}"


# ---------------------------------------------------------------------------
# jobs files

@pytest.mark.parametrize("item, where, what", [
    (job(dataset_size=None), "job 'a': dataset_size", "missing required field"),
    (job(global_batch=None), "job 'a': global_batch", "missing required field"),
    (job(workload=None), "job 'a': workload", "missing required field"),
    (job(dataset_size=-5), "job 'a': dataset_size", "must be >= 1, got -5"),
    (job(epochs=0), "job 'a': epochs", "must be > 0"),
    (job(model_size_mb=-1), "job 'a': model_size_mb", "must be >= 0"),
    (job(weight=0), "job 'a': weight", "must be > 0"),
    (job(global_batch=12.5), "job 'a': global_batch", "expected a whole number"),
    (job(dataset_size="many"), "job 'a': dataset_size", "expected a number"),
    (job(name="'a b'"), "job 'a b': name", "letters, digits"),
    (job(min_gpus=3, max_gpus=2), "job 'a': max_gpus", "must be >= min_gpus (3)"),
    (job(colour="red"), "job 'a'", "unknown field 'colour'; valid fields: name, workload"),
    (job(entrypoint="'not a module'"), "job 'a': entrypoint", "'module.path:function'"),
    # a workload reaches probe scripts and job environments: an identifier only
    (job(workload='"x\\ntouch /tmp/PWNED #"'), "job 'a': workload", "1-128 ASCII letters, digits"),
    (job(workload="'$(id)'"), "job 'a': workload", "starting with a letter or digit"),
    (job(workload="''"), "job 'a': workload", "is not valid"),
    ("{workload: w}", "jobs[0]: name", "missing required field"),
    ("7", "jobs[0]", "expected a mapping, got int"),
])
def test_bad_job_fields(write, item, where, what) -> None:
    path = write("jobs.yaml", jobs_yaml(item))
    with pytest.raises(InputError) as e:
        load_jobs(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: {where}: ") or msg.startswith(f"{path}: {where}"), msg
    assert what in msg


@pytest.mark.parametrize("text, what", [
    ("jobs: []\n", "the 'jobs' list is empty"),
    ("{}\n", "expected a list under 'jobs:'"),
    ("jobs: 3\n", "'jobs' must be a list"),
    ("tasks: []\n", "unknown top-level key 'tasks'"),
    ("jobs: [\n", "not valid YAML"),
    ("", "expected a list under 'jobs:'"),
])
def test_bad_jobs_documents(write, text, what) -> None:
    path = write("jobs.yaml", text)
    with pytest.raises(InputError, match=what) as e:
        load_jobs(path)
    assert str(e.value).startswith(str(path))


def test_duplicate_job_names(write) -> None:
    path = write("jobs.yaml", jobs_yaml(JOB, JOB))
    with pytest.raises(InputError, match="job 'a': duplicate job name") as e:
        load_jobs(path)
    assert e.value.source == str(path)


def test_unreadable_files(tmp_path, write) -> None:
    for loader in (load_jobs, load_cluster, load_throughputs):
        with pytest.raises(InputError, match="file not found") as e:
            loader(tmp_path / "missing.yaml")
        assert e.value.source == str(tmp_path / "missing.yaml")
        with pytest.raises(InputError, match="directory|cannot read"):
            loader(tmp_path)
        with pytest.raises(InputError, match="cannot read"):
            loader(write("binary", b"\xff\xfe\x00\x81"))


def test_good_jobs_file_round_trips(write) -> None:
    path = write("jobs.yaml", jobs_yaml(job(weight=2, arrival_s=30, max_gpus=4,
                                            gpu_types="[V100]", command="'python train.py'")))
    (j,) = load_jobs(path)
    assert (j.name, j.weight, j.arrival_s, j.max_gpus, j.gpu_types) == ("a", 2.0, 30.0, 4, ("v100",))
    assert j.command == ("python", "train.py")
    assert j.steps_per_epoch == 16 and j.iterations == 16  # ceil(1000 / 64)
    assert parse_jobs({"jobs": [j.to_dict()]}, "again")[0] == j


# ---------------------------------------------------------------------------
# cluster files

def test_hostlist_expansion(write) -> None:
    assert expand_hostlist("a100-[1-4]", "x", "y") == ["a100-1", "a100-2", "a100-3", "a100-4"]
    assert expand_hostlist("n[01-02,7]", "x", "y") == ["n01", "n02", "n7"]
    c = load_cluster(write("c.yaml", "network: {inter_node_gbps: 25}\nnodes:\n"
                           "  - {names: 'a100-[1-4]', gpu_type: A100, gpus: 2}\n"
                           "  - {name: t4-1, gpu_type: t4, gpus: 1, state: drained}\n"))
    assert [n.name for n in c.nodes] == ["a100-1", "a100-2", "a100-3", "a100-4", "t4-1"]
    assert c.count_by_type() == {"a100": 8}  # the drained node is not usable
    assert len(c.gpus) == 8 and c.gpus[3].node == "a100-2" and c.gpus[3].index == 1
    assert (c.intra_node_gbps, c.inter_node_gbps) == (300.0, 25.0)


@pytest.mark.parametrize("text, what", [
    ("nodes: []\n", "empty partition: expected a non-empty list under 'nodes:'"),
    ("name: x\n", "empty partition"),
    ("nodes:\n  - {names: v1, gpu_type: v100, gpus: 2, state: down}\n",
     "empty partition: no node is up"),
    ("nodes:\n  - {names: 'a100-[1-', gpu_type: a100, gpus: 2}\n",
     "nodes[0]: bad hostlist 'a100-[1-'"),
    ("nodes:\n  - {names: 'a[1-2]', gpu_type: a100, gpus: 2}\n  - {name: a2, gpu_type: t4, gpus: 1}\n",
     "nodes[1]: node 'a2' is listed twice"),
    ("nodes:\n  - {names: a1, gpu_type: a100, gpus: 0}\n", "nodes[0]: gpus: must be >= 1"),
    ("nodes:\n  - {names: a1, gpus: 2}\n", "nodes[0]: gpu_type: missing required field"),
    ("nodes:\n  - {names: a1, gpu_type: 'a 100', gpus: 2}\n", "nodes[0]: gpu_type: 'a 100' is not valid"),
    ("nodes:\n  - {gpu_type: a100, gpus: 2}\n", "nodes[0]: give 'names'"),
    ("network: {inter_node_gbps: -1}\nnodes:\n  - {names: a1, gpu_type: a100, gpus: 2}\n",
     "network: inter_node_gbps: must be > 0"),
    ("nodes:\n  - {names: a1, gpu_type: a100, gpus: 2, colour: red}\n",
     "nodes[0]: unknown field 'colour'"),
])
def test_bad_cluster_files(write, text, what) -> None:
    path = write("cluster.yaml", text)
    with pytest.raises(InputError) as e:
        load_cluster(path)
    assert str(e.value).startswith(f"{path}: ")
    assert what in str(e.value)


# ---------------------------------------------------------------------------
# throughput CSV

@pytest.mark.parametrize("text, where, what", [
    ("", None, "empty file; expected a header line"),
    ("workload,gpu_type,local_batch\nw,v100,1\n", "line 1", "missing column 'step_time_s'"),
    ("workload,gpu_type,local_batch,step_time_s,colour\n", "line 1", "unknown column 'colour'"),
    ("workload,gpu_type,local_batch,step_time_s\n", None, "no profile rows"),
    ("workload,gpu_type,local_batch,step_time_s\nw,v100,abc,0.1\n", "line 2",
     "column 'local_batch': 'abc' is not a number"),
    ("workload,gpu_type,local_batch,step_time_s\nw,v100,16,-0.1\n", "line 2",
     "column 'step_time_s': must be a positive number"),
    ("workload,gpu_type,local_batch,step_time_s\nw,v100,16,nan\n", "line 2", "positive number"),
    ("workload,gpu_type,local_batch,step_time_s\nw,v100,16.5,0.1\n", "line 2", "whole number"),
    ("workload,gpu_type,local_batch,step_time_s\nw,v100,16\n", "line 2",
     "column 'step_time_s' is empty"),
    ("workload,gpu_type,local_batch,step_time_s\nw;id,v100,16,0.1\n", "line 2",
     "column 'workload': 'w;id' is not valid"),
    ("workload,gpu_type,local_batch,step_time_s\n,v100,16,0.1\n", "line 2",
     "column 'workload' is empty"),
    ("workload,gpu_type,local_batch,step_time_s\nw,v 100,16,0.1\n", "line 2", "not a GPU type"),
    # surplus fields were silently dropped before
    ("workload,gpu_type,local_batch,step_time_s\nw,v100,16,0.1\nw,v100,32,0.2,7\n", "line 3",
     "5 fields, the header has 4"),
    # blank lines do not shift the line named in the error
    ("workload,gpu_type,local_batch,step_time_s\n\nw,v100,16,0.1\n\nw,v100,x,0.1\n", "line 5",
     "'x' is not a number"),
])
def test_bad_csv(write, text, where, what) -> None:
    path = write("p.csv", text)
    with pytest.raises(InputError) as e:
        load_throughputs(path)
    prefix = f"{path}: {where}: " if where else f"{path}: "
    assert str(e.value).startswith(prefix), str(e.value)
    assert what in str(e.value)


def test_csv_reads_optional_columns() -> None:
    rows = parse_csv("workload,gpu_type,local_batch,step_time_s,sync_time_s,max_local_batch\n"
                     "w,V100,16,0.1,,\nw,v100,32,0.2,0.01,48\n", "p.csv")
    assert rows[0].gpu_type == "v100" and rows[0].sync_time_s is None
    assert rows[1].sync_time_s == 0.01 and rows[1].max_local_batch == 48


# ---------------------------------------------------------------------------
# jobs x cluster x profiles

def problem_error(write, job_items, cluster=CLUSTER, csv=CSV) -> InputError:
    jobs = load_jobs(write("jobs.yaml", jobs_yaml(*job_items)))
    with pytest.raises(InputError) as e:
        PlanningProblem(jobs, load_cluster(write("c.yaml", cluster)),
                        load_throughputs(write("p.csv", csv)), jobs_source="jobs.yaml")
    return e.value


def test_unknown_gpu_type_in_job(write) -> None:
    e = problem_error(write, [job(gpu_types="[h100]")])
    assert str(e) == ("jobs.yaml: job 'a': gpu_types: unknown GPU type 'h100'; "
                      "the partition has v100")


def test_unknown_workload(write) -> None:
    e = problem_error(write, [job(workload="bert")])
    assert str(e).startswith("jobs.yaml: job 'a': workload 'bert' has no throughput profile")
    assert "profiled workloads: w" in str(e)


def test_job_that_fits_no_gpu_type(write) -> None:
    e = problem_error(write, [job()], cluster="nodes:\n  - {names: t1, gpu_type: t4, gpus: 4}\n")
    assert str(e) == ("jobs.yaml: job 'a': fits no GPU: workload 'w' is profiled on k80, v100, "
                      "the partition has t4")


def test_job_whose_batch_fits_no_gpu_set(write) -> None:
    # 4 v100 with a cap of 64 hold 256 samples at most
    e = problem_error(write, [job(global_batch=257)])
    assert "job 'a': fits no GPU set: global_batch 257" in str(e)
    e = problem_error(write, [job(global_batch=128, max_gpus=1)])
    assert "fits no GPU set" in str(e)


def test_min_gpus_out_of_reach(write) -> None:
    e = problem_error(write, [job(min_gpus=5)])
    assert "job 'a': min_gpus 5 cannot be met: at most 4 usable GPUs" in str(e)


# ---------------------------------------------------------------------------
# policies and parameters

def test_unknown_policy_and_bad_params() -> None:
    with pytest.raises(InputError, match=r"--policy: unknown policy 'nope'; valid: allox, "):
        make_policy("nope")
    with pytest.raises(InputError, match=r"--param: policy 'jps' has no parameter 'gamma'; "
                                         r"valid parameters: alpha=0.7"):
        make_policy("jps", {"gamma": 1})
    with pytest.raises(InputError, match=r"--param: policy 'jps': alpha must be in \[0, 1\)"):
        make_policy("jps", {"alpha": 2.0})
    with pytest.raises(InputError, match="expected key=value"):
        parse_param("alpha")
    assert parse_param("samples=60") == ("samples", 60)
    assert parse_param("alpha=0.5") == ("alpha", 0.5)
    assert parse_param("trim=false") == ("trim", False)
    assert parse_param("matching=raw") == ("matching", "raw")


def test_auto_refuses_params(examples) -> None:
    from hetsched.io.specs import load_cluster as lc

    with pytest.raises(PlanningError, match="--param applies to one policy"):
        make_plan(load_jobs(examples["jobs"]), lc(examples["cluster"]),
                  load_throughputs(examples["throughputs"]), "auto", {"samples": 3})


# ---------------------------------------------------------------------------
# through the CLI: exit code 2, one line on stderr, no traceback

CLI_CASES = {
    "missing field": (jobs_yaml(job(dataset_size=None)), CLUSTER, CSV, [],
                      "job 'a': dataset_size: missing required field"),
    "negative size": (jobs_yaml(job(dataset_size=-1)), CLUSTER, CSV, [], "must be >= 1"),
    "unknown gpu type": (jobs_yaml(job(gpu_types="[h100]")), CLUSTER, CSV, [],
                         "unknown GPU type 'h100'"),
    "fits no gpu": (jobs_yaml(job()), "nodes:\n  - {names: t1, gpu_type: t4, gpus: 4}\n", CSV,
                    [], "fits no GPU"),
    "empty partition": (jobs_yaml(job()), "nodes: []\n", CSV, [], "empty partition"),
    "duplicate names": (jobs_yaml(JOB, JOB), CLUSTER, CSV, [], "duplicate job name"),
    "bad hostlist": (jobs_yaml(job()), "nodes:\n  - {names: 'v[1-', gpu_type: v100, gpus: 1}\n",
                     CSV, [], "bad hostlist"),
    "bad csv": (jobs_yaml(job()), CLUSTER, "workload,gpu_type,local_batch,step_time_s\nw,v100,x,1\n",
                [], "line 2: column 'local_batch'"),
    "bad yaml": ("jobs: [\n", CLUSTER, CSV, [], "not valid YAML"),
    "unknown policy": (jobs_yaml(job()), CLUSTER, CSV, ["--policy", "nope"], "unknown policy"),
    "bad param": (jobs_yaml(job()), CLUSTER, CSV, ["--policy", "jps", "--param", "alpha"],
                  "expected key=value"),
    "unknown param": (jobs_yaml(job()), CLUSTER, CSV, ["--policy", "has", "--param", "x=1"],
                      "has no parameter 'x'"),
    "bad param value": (jobs_yaml(job()), CLUSTER, CSV,
                        ["--policy", "jps", "--param", "samples=0"], "samples must be >= 1"),
    "auto with param": (jobs_yaml(job()), CLUSTER, CSV, ["--param", "samples=3"],
                        "applies to one policy"),
    "exhaustive too big": (jobs_yaml(job(), job(name="b")), CLUSTER, CSV,
                           ["--policy", "exhaustive", "--param", "max_pairs=2"],
                           "exceeds max_pairs=2"),
}


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_cli_bad_input_one_line_exit_2(runner, write, case) -> None:
    jobs, cluster, csv, extra, what = CLI_CASES[case]
    args = ["plan", str(write("jobs.yaml", jobs)), "--cluster", str(write("c.yaml", cluster)),
            "--throughputs", str(write("p.csv", csv)), *extra]
    res = runner.invoke(main, args)
    assert res.exit_code == 2, (res.output, res.exception)
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("hetsched: error: ")
    assert what in lines[0]
    assert "Traceback" not in res.output


@pytest.mark.parametrize("which", ["jobs", "cluster", "throughputs"])
@pytest.mark.parametrize("bad", ["missing", "directory"])
def test_cli_unreadable_files(runner, write, tmp_path, which, bad) -> None:
    files = {"jobs": write("jobs.yaml", jobs_yaml(job())), "cluster": write("c.yaml", CLUSTER),
             "throughputs": write("p.csv", CSV)}
    files[which] = tmp_path / "nope" if bad == "missing" else tmp_path
    res = runner.invoke(main, ["plan", str(files["jobs"]), "--cluster", str(files["cluster"]),
                               "--throughputs", str(files["throughputs"])])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(f"hetsched: error: {files[which]}: ")
    assert "Traceback" not in res.output


def test_cli_missing_throughputs_flag(runner, write, tmp_path, monkeypatch) -> None:
    # Without --throughputs, plan reads the profile history; with no state file
    # it must say so, and must not create one. (The Slurm tests' session sets
    # HETSCHED_STATE to a live testbed's store: point it somewhere empty.)
    state = tmp_path / "none" / "state.db"
    monkeypatch.setenv("HETSCHED_STATE", str(state))
    res = runner.invoke(main, ["plan", str(write("jobs.yaml", jobs_yaml(job()))),
                               "--cluster", str(write("c.yaml", CLUSTER))])
    assert res.exit_code == 2
    assert res.stderr.strip().startswith("hetsched: error: --throughputs: no throughput CSV")
    assert "hetsched profile" in res.stderr
    assert not state.exists()


def test_cli_plan_reads_the_profile_history(runner, write, tmp_path, monkeypatch) -> None:
    """No --throughputs: the profiles that `hetsched profile` stored are the source."""
    import json

    from hetsched.state.store import open_store

    state = tmp_path / "state.db"
    monkeypatch.setenv("HETSCHED_STATE", str(state))
    with open_store(state) as st:
        st.put_profile("w", "v100", 16, 0.05, source="probe")
        st.put_profile("w", "v100", 64, 0.11, source="probe")
    res = runner.invoke(main, ["plan", str(write("jobs.yaml", jobs_yaml(job()))),
                               "--cluster", str(write("c.yaml", CLUSTER)), "--format", "json"])
    assert res.exit_code == 0, res.stderr
    plan = json.loads(res.stdout)
    (seg,) = plan["jobs"][0]["segments"]
    assert sum(w["local_batch"] for w in seg["workers"]) == 64
    # t(b) = 0.03 + 0.00125 b from the two stored rows: the plan used them
    b = seg["workers"][0]["local_batch"]
    assert seg["compute_s"] == pytest.approx(0.03 + 0.00125 * b, rel=1e-6)
