#!/bin/bash
# ctest mpi.memory_tier: the memory tier with real MPI processes on emulated hosts. Each rank's
# host is named by DCP_HOST_ID (HOSTS lists them, one per rank); every host keeps its tier in
# its own directory under the tier base, so losing a host is killing the job and removing that
# host's directory (what a reboot does to its /dev/shm). The durable root is shared.
#
#   tier_test.sh MPIEXEC DRIVER [ROUNDS]      (DRIVER: tier_mpi_test; ROUNDS of the kill loop)
#
# Scenarios: lose one host of four, restart on the three others with another layout: the newest
# step comes from memory with no file read from the root; lose two partner hosts: the step
# they alone held is gone, the newest step left loads, its missing files from the root; a
# flipped byte in one copy: the other copy is used; then ROUNDS rounds of saving, killing the
# job at a random moment, losing a random host, and restoring on the others: never older than
# the last step whose save returned, always one step's exact data. And an incremental root
# fed by the tier's drains, restored from memory and from the root.
# No timing assertions: timeouts are hang guards.
set -u
mpiexec=$1
driver=$2
rounds=${3:-20}
work=$(mktemp -d "${TMPDIR:-/tmp}/dcp-tier-test-XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
log=$work/job.log

fail() {
  echo "FAIL: $*"
  tail -40 "$log"
  exit 1
}

# job HOSTS ARGS...: one MPI job, rank i on the i-th host of HOSTS; its output in $log.
job() {
  local hosts=$1
  shift
  local n
  n=$(echo "$hosts" | wc -w)
  HOSTS="$hosts" timeout -k 10 300 "$mpiexec" -np "$n" -x HOSTS sh -c \
    'DCP_HOST_ID=$(echo $HOSTS | cut -d" " -f$((OMPI_COMM_WORLD_RANK + 1))) exec "$0" "$@"' \
    "$driver" "$@" >"$log" 2>&1
}

# Waits until no process of the driver is left (a killed job's ranks may still be exiting):
# a restarted job meets its predecessor's processes only when they are truly gone.
reap() {
  for _ in $(seq 1 300); do
    pgrep -x "$(basename "$driver" | cut -c1-15)" >/dev/null || return 0
    sleep 0.1
  done
  fail "processes of a killed job are still running after 30 s"
}

# lose TIER HOST...: the hosts' memory is gone.
lose() {
  local tier=$1
  shift
  for h in "$@"; do rm -rf "$tier"/root-*/"$h"; done
}

echo "== one host lost, restart on three with another layout"
root=$work/a/ckpt tier=$work/a/tier
job "h0 h1 h2 h3" save "$root" "$tier" tp2,dp2 3 --persist-every 2 --no-persist-at-exit --async ||
  fail "save job"
grep -q '^saved 3$' "$log" || fail "step 3 was not saved"
[ -d "$root/step_000000002" ] && [ ! -d "$root/step_000000003" ] ||
  fail "persist_every 2 should have written step 2, not step 3, to the root"
lose "$tier" h2
job "h0 h1 h3" restore "$root" "$tier" tp3 --expect-step 3 --expect-memory yes \
  --expect-no-storage || fail "restore after losing h2"
cat "$log" | grep restored

echo "== two partner hosts lost: what they alone held is gone"
root=$work/b/ckpt tier=$work/b/tier
job "h0 h1 h2 h3" save "$root" "$tier" dp4 3 --persist-every 2 --no-persist-at-exit ||
  fail "save job"
lose "$tier" h1 h2
# Step 3's files of h1 were on h1 and h2 only; step 2 is in the root, its files the tiers
# lost come from there.
job "h0 h3" restore "$root" "$tier" tp2 --expect-step 2 || fail "restore after losing h1 and h2"
grep restored "$log"
grep -q 'from storage 0' "$log" && fail "step 2's lost files cannot have come from memory"

echo "== flipped bytes in one copy: the other copy is used"
root=$work/c/ckpt tier=$work/c/tier
job "h0 h1 h2 h3" save "$root" "$tier" tp4 2 --persist-every 0 --no-persist-at-exit ||
  fail "save job"
[ -d "$root/step_000000002" ] && fail "nothing should be in the root"
victim=$(ls "$tier"/root-*/h0/step_000000002/data-*-r00000.safetensors | head -1)
[ -n "$victim" ] || fail "h0 holds no file of its rank 0"
# One byte in every MiB past the header: whatever rank 0 reads of its own file is damaged.
size=$(stat -c %s "$victim")
for ((at = 65536; at < size; at += 1048576)); do
  printf '\xff' | dd of="$victim" bs=1 seek=$at conv=notrunc status=none
done
job "h0 h1 h2 h3" restore "$root" "$tier" tp4 --expect-step 2 --expect-memory yes \
  --expect-no-storage || fail "restore with flipped bytes"
grep restored "$log"
grep -q "memory tier copy on host h0" "$log" || fail "the damaged copy was not reported"
# In every rank's load result, naming the holder's host and the file.
for r in 0 1 2 3; do
  grep -q "^rank $r: damaged copy: host h0: step 2, $(basename "$victim"): " "$log" ||
    fail "rank $r's load result does not name h0's damaged $(basename "$victim")"
done

echo "== incremental root: drains write what changed; restores from memory and from the root"
root=$work/e/ckpt tier=$work/e/tier
job "h0 h1 h2 h3" save "$root" "$tier" tp2,dp2 3 --incremental --async || fail "save job"
grep -q '^saved 3$' "$log" || fail "step 3 was not saved"
# keep_last 2 keeps steps 2 and 3, and step 1 as their base.
grep -q '^referencing 2$' "$log" || fail "steps 2 and 3 should reference a base"
lose "$tier" h1
job "h0 h2 h3" restore "$root" "$tier" tp3 --incremental --expect-step 3 --expect-memory yes \
  --expect-no-storage || fail "incremental: restore after losing h1"
grep restored "$log"
rm -rf "$tier"
job "h0 h1" restore "$root" "$tier" tp2 --incremental --expect-step 3 --expect-memory no ||
  fail "incremental: restore from the root"
grep restored "$log"

echo "== kill loop: $rounds rounds of save, SIGKILL, a lost host, restore"
root=$work/d/ckpt tier=$work/d/tier
last=0
all="h0 h1 h2 h3"
for round in $(seq 1 "$rounds"); do
  die=$((500 + RANDOM % 2500))
  mode=""
  [ $((round % 2)) -eq 0 ] && mode=--async
  job "$all" save "$root" "$tier" tp2,dp2 1000 --persist-every 3 --die-after-ms "$die" $mode
  reap
  saved=$(grep -E '^saved [0-9]+$' "$log" | tail -1 | awk '{print $2}')
  [ -n "$saved" ] && last=$saved
  grep -q FAIL "$log" && fail "round $round: the save job failed"
  gone=h$((RANDOM % 4))
  lose "$tier" "$gone"
  survivors=$(echo "$all" | tr ' ' '\n' | grep -v "^$gone\$" | tr '\n' ' ')
  job "$survivors" restore "$root" "$tier" tp3 --expect-at-least "$last" ||
    fail "round $round (killed after $die ms, lost $gone, last saved $last)"
  echo "round $round: ${mode:-sync} saves killed after $die ms, last saved $last, lost $gone:" \
    "$(grep restored "$log")"
done
echo "mpi.memory_tier: PASSED"
