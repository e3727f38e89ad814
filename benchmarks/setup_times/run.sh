#!/usr/bin/env bash
# Reproduces benchmarks/setup_times/result.md: how long a new user's two commands take on this
# machine. A fresh clone of the current commit (into a temporary folder), then, in it:
#   1. `make demo`, from nothing: the venv install, perf_analyzer, the compiled stages, the demo;
#   2. `make test`, right after it (the venv is then installed): lint, the docs build, the tests.
# Wall-clock time of each with /usr/bin/time's format (bash's `time`), the machine, the load average
# before and after, the commit. About 45 minutes on a 2-core machine.
#
#   bash benchmarks/setup_times/run.sh      # from the repository root; needs git, make, python3.11
set -euo pipefail
cd "$(dirname "$0")/../.."
root="$PWD"
out="$root/benchmarks/setup_times/result.md"
work="$(mktemp -d)"
logs="$root/artifacts/setup_times"   # each command's whole output, kept (git ignores artifacts/)
mkdir -p "$logs"
trap 'rm -rf "$work"' EXIT
commit="$(git rev-parse --short HEAD)"
git clone --quiet "$root" "$work/clone"
cd "$work/clone"

machine() {
  PYTHONPATH="$root" "$root/.venv/bin/python" -c \
    'from bundle.records import describe, machine_with_flags; print(machine_with_flags(describe()))' 2>/dev/null ||
    echo "$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
}
step() {  # step <name> <make target>: runs it, prints "<seconds>"; its output in $logs/<name>.log
  local start end
  start=$(date +%s)
  if ! make "$2" >"$logs/$1.log" 2>&1; then
    echo "make $2 failed; its last lines:" >&2
    tail -20 "$logs/$1.log" >&2
    exit 1
  fi
  end=$(date +%s)
  echo $((end - start))
}
minutes() { printf '%d min %02d s' $(($1 / 60)) $(($1 % 60)); }

started="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
demo=$(step demo demo)
test=$(step test test)
summary="$(grep -E '^=+ .*(passed|failed).* in ' "$logs/test.log" | tail -1 | tr -d '=' | sed 's/^ *//; s/ *$//')"
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"

cat >"$out" <<RESULT
# How long the two commands take

<!-- --8<-- [start:results] -->
- **Command**: \`bash benchmarks/setup_times/run.sh\` (a fresh clone of commit \`$commit\`, then \`make demo\` and \`make test\` in it); started $started
- **Machine**: $(machine)
- **Load average** (1/5/15 min) at start: $load_before; at end: $load_after. The machine may be shared.

| command | what it did | wall clock |
|---|---|---:|
| \`make demo\` | from a fresh clone: the venv installed, perf_analyzer, the compiled stages built, then the demo | $(minutes "$demo") |
| \`make test\` | right after it: lint, the strict docs build, the tests ($summary) | $(minutes "$test") |
<!-- --8<-- [end:results] -->
RESULT
echo "wrote $out"
