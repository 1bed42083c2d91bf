#!/bin/bash
# The checkpoint manager under SIGKILL: a 4-rank job saving every step is killed (every rank
# and mpirun, SIGKILL) at random moments, KILLS times; every restart must resume from a complete
# step (the driver checks the values it loaded) no older than the last step whose save returned.
# A final run goes on to completion. No timing assertions: the waits are hang guards.
#
#   manager_kill.sh DRIVER MPIEXEC [KILLS]
set -u
driver=$1
mpiexec=$2
kills=${3:-5}
work=$(mktemp -d "${TMPDIR:-/tmp}/dcp-manager-kill-XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/ckpt
pids=$work/pids
mkdir -p "$root" "$pids"
run() {  # run N LOG MAX_STEP: starts the job in its own session
  rm -f "$pids"/*.pid
  setsid "$mpiexec" -np 4 --oversubscribe "$driver" "$root" "$3" "$pids" >"$2" 2>&1 &
  echo $! >"$work/mpirun.pid"
}
last_saved=0
fail() { echo "FAIL: $*"; for f in "$work"/run*.log; do echo "== $f"; tail -20 "$f"; done; exit 1; }
check_resume() {  # check_resume LOG
  grep -q MISMATCH "$1" && fail "$1: a restart loaded a state that is not one step's"
  local resumed
  resumed=$(grep -m1 '^resumed ' "$1" | awk '{print $2}')
  [ -z "$resumed" ] && return 1
  [ "$resumed" = none ] && resumed=0
  [ "$resumed" -lt "$last_saved" ] &&
    fail "$1: resumed step $resumed, but step $last_saved had been saved"
  echo "$1: resumed $resumed (last saved before: $last_saved)"
  return 0
}
for i in $(seq 1 "$kills"); do
  log=$work/run$i.log
  before=$(grep -c '^saved ' "$log" 2>/dev/null || echo 0)
  run "$i" "$log" 1000000
  # Wait (hang guard: 120 s) until this run saved a step, then kill at a random moment.
  for _ in $(seq 1 1200); do
    grep -q '^saved ' "$log" 2>/dev/null && break
    sleep 0.1
  done
  sleep "0.$((RANDOM % 10))$((RANDOM % 10))"
  for f in "$pids"/*.pid; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done
  mp=$(cat "$work/mpirun.pid")
  kill -9 -- "-$mp" 2>/dev/null
  kill -9 "$mp" 2>/dev/null
  wait "$mp" 2>/dev/null
  check_resume "$log" || fail "$log: run $i did not get to resume"
  s=$(grep '^saved ' "$log" | tail -1 | awk '{print $2}')
  [ -n "$s" ] && last_saved=$s
  echo "run $i killed after saving step ${s:-none}"
done
log=$work/final.log
target=$((last_saved + 4))
run final "$log" "$target"
wait "$(cat "$work/mpirun.pid")"
rc=$?
check_resume "$log" || fail "$log: the final run did not resume"
[ "$rc" -ne 0 ] && fail "final run exited $rc"
grep -q "^saved $target\$" "$log" || fail "final run did not reach step $target"
steps=$(ls "$root" | grep -c '^step_')
[ "$steps" -ne 2 ] && fail "keep_last 2 left $steps step directories: $(ls "$root")"
echo "OK: $kills kills, every restart resumed a complete step; final run reached $target"
