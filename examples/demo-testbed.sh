#!/usr/bin/env bash
# `make demo`'s second half: where no Slurm site answers, the bundled testbed
# example end to end on a local Slurm test cluster (README, "End to end on the
# local testbed"): probe, plan from Slurm and the profile history, submit, wait
# until every job has trained to its end, print `hetsched status`. Everything
# lives in a temporary directory (its own state file, spool and daemons) and is
# taken down at the end, whatever happened. Where a site answers (`scontrol
# ping`), it is left alone. About a minute on 2 cores.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
jobs="$here/testbed-jobs.yaml"
wait_s="${HETSCHED_DEMO_WAIT_S:-300}"

if scontrol ping >/dev/null 2>&1; then
  echo "demo: a Slurm site answers here (scontrol ping), so no test cluster is started."
  echo "demo: its GPU mix: hetsched cluster; the whole path: README, \"Using it\"."
  exit 0
fi
for cmd in slurmctld slurmd munged sbatch; do
  if ! command -v "$cmd" >/dev/null; then
    echo "demo: no local Slurm to start ($cmd not found; as root, make deps installs it);"
    echo "demo: the plan above is the whole demo here."
    exit 0
  fi
done

if [ "$(id -u)" != 0 ]; then
  echo "demo: a local test cluster runs its Slurm daemons as root; not root here, so"
  echo "demo: the plan above is the whole demo (as root, make demo also runs it on Slurm)."
  exit 0
fi

dir="$(mktemp -d "${TMPDIR:-/tmp}/hetsched-demo.XXXXXX")"
cleanup() {
  hetsched testbed down --dir "$dir" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT

echo "demo: a local Slurm test cluster in $dir (typed fake GPUs on this CPU)"
hetsched testbed up --dir "$dir"
eval "$(hetsched testbed env --dir "$dir")"
hetsched profile "$jobs"
hetsched plan "$jobs" --out "$dir/plan.json" --no-gantt
hetsched submit "$dir/plan.json"

ended() {  # every job of the current batch has left the queue
  hetsched status --format json | python3 -c '
import json, sys
jobs = json.load(sys.stdin)["jobs"]
sys.exit(0 if jobs and all(j["state"] not in ("PENDING", "RUNNING", "CONFIGURING",
                                              "COMPLETING", "REQUEUED") for j in jobs) else 1)'
}
deadline=$((SECONDS + wait_s))
until ended; do
  if ((SECONDS > deadline)); then
    hetsched status
    echo "demo: the jobs did not end within ${wait_s} s (HETSCHED_DEMO_WAIT_S)" >&2
    exit 1
  fi
  sleep 2
done
hetsched status
echo "demo: done; the test cluster goes down now"
