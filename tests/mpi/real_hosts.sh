#!/usr/bin/env bash
# ctest mpi.hosts: one MPI job across real hosts on this machine. Each host is a network
# namespace with its own host name (a UTS namespace) and a veth link to a bridge; mpirun runs
# in a namespace of its own and starts Open MPI's daemons through netns_rsh.sh (the rsh
# launcher's agent), which enters the host's namespaces. Open MPI talks TCP only (pml ob1,
# btl tcp,self: no shared memory between hosts); the checkpoint directory under SCRATCH is
# shared by all hosts, as a parallel file system would be (the namespaces share the file
# system). The job is save_mpi_test's RealHostsMpi tests: save, load with read-once broadcast
# across hosts, storage bytes read = unique bytes, every byte checked.
#
#   real_hosts.sh MPIRUN SAVE_MPI_TEST SCRATCH [HOSTS [RANKS_PER_HOST]]    (default 3 2)
#   real_hosts.sh --tier MPIRUN TIER_DRIVER SCRATCH
#     (ctest mpi.hosts_memory_tier: 4 hosts of 1 rank, each with a private tmpfs of its own (in
#      a mount namespace held by a sleeping process, /run/dcp-mnt/<host>.pid, entered by
#      netns_rsh.sh) as its memory
#      tier; save steps 1..3, lose host 2 (its processes gone, its tmpfs replaced by an empty
#      one), restore on the other 3 hosts in another layout: step 3 from memory, no file from
#      the root)
#   real_hosts.sh --bench RATE MPIRUN DCP_CLI SCRATCH HOSTS RANKS_PER_HOST [BENCH ARGS...]
#     (by hand: `dcp bench` across the hosts, each host's link capped at RATE
#      (tc tbf, e.g. 1gbit; "none" for no cap); loads with broadcast on and off, to see when
#      broadcast beats reading; no assertions)
#
# Exit 77 (ctest SKIP) with the reason when namespaces cannot be made here (not root, no
# CAP_NET_ADMIN / CAP_SYS_ADMIN, a container without them). Every name of a run holds the
# script's pid ("dcpn<pid>..."): runs do not collide, and a run that was killed leaves
# namespaces that the next run removes. All links live inside the run's namespaces (the
# bridge too), so the root namespace's network is never touched.
set -uo pipefail

bench_rate=""
tier_mode=""
if [ "${1:-}" = --tier ]; then
  tier_mode=1
  mpirun=$2 prog=$3 scratch=$4 hosts=4 per_host=1
  shift 4
elif [ "${1:-}" = --bench ]; then
  bench_rate=$2
  shift 2
  mpirun=$1 prog=$2 scratch=$3 hosts=$4 per_host=$5
  shift 5
  bench_args=("$@")
else
  mpirun=$1 prog=$2 scratch=$3 hosts=${4:-3} per_host=${5:-2}
fi
case "$hosts,$per_host" in
  *[!0-9,]* | ,* | *, | 0,* | *,0)
    echo "usage: real_hosts.sh MPIRUN SAVE_MPI_TEST SCRATCH [HOSTS [RANKS_PER_HOST]]" >&2
    exit 2
    ;;
esac
[ "$hosts" -ge 2 ] || { echo "real_hosts.sh: needs 2 hosts or more" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
id=dcpn$$
switch=${id}s launcher=${id}l
subnet=10.77.0  # inside the run's own namespaces only
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset DCP_HOST_ID  # the hosts are real

skip() {
  echo "SKIP: $*"
  exit 77
}
fail() {
  echo "FAIL: $*"
  exit 1
}

# Ends the processes still inside namespace $1 (only ever this script's job, or the job of a
# dead run of it) and removes it.
remove_ns() {
  local pids
  pids=$(ip netns pids "$1" 2>/dev/null)
  # shellcheck disable=SC2086
  [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
  ip netns del "$1" 2>/dev/null
  return 0
}

namespaces() { ip netns list 2>/dev/null | awk '{print $1}'; }

# Ends the process holding host $1's mount namespace (real_hosts.sh --tier): its private
# tmpfs goes with the namespace.
remove_mnt() {
  local pid
  pid=$(cat "/run/dcp-mnt/$1.pid" 2>/dev/null)
  [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
  rm -f "/run/dcp-mnt/$1.pid"
}

cleanup() {
  local ns
  for ns in $(namespaces | grep -E "^${id}(s|l|h[0-9]+)\$"); do remove_ns "$ns"; done
  for ns in /run/dcp-mnt/"${id}"h*.pid; do [ -e "$ns" ] && remove_mnt "$(basename "$ns" .pid)"; done
  [ -n "${scratch_run:-}" ] && rm -rf "$scratch_run"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

for tool in ip unshare timeout; do
  command -v "$tool" >/dev/null || skip "'$tool' not found"
done

# Namespaces of runs whose script is gone (killed outright: SIGKILL, a timeout), or whose pid
# this run got (it has made none yet).
for ns in $(namespaces | grep -E '^dcpn[0-9]+(s|l|h[0-9]+)$'); do
  owner=${ns#dcpn}
  owner=${owner%%[slh]*}
  if kill -0 "$owner" 2>/dev/null && tr '\0' ' ' <"/proc/$owner/cmdline" 2>/dev/null |
    grep -q real_hosts.sh; then
    continue  # a run in progress
  fi
  echo "removing namespace $ns of an earlier run (pid $owner is gone)"
  remove_ns "$ns"
done

for f in /run/dcp-mnt/dcpn*.pid; do
  [ -e "$f" ] || continue
  owner=${f##*/dcpn}
  owner=${owner%%h*}
  kill -0 "$owner" 2>/dev/null || remove_mnt "$(basename "$f" .pid)"
done

for d in "$scratch"/run*; do
  [ -d "$d" ] || continue
  owner=${d##*/run}
  kill -0 "$owner" 2>/dev/null || rm -rf "$d"
done

# What this machine allows: a namespace, a veth pair into it, a UTS namespace.
if ! err=$(ip netns add "$switch" 2>&1); then
  skip "cannot create a network namespace (needs root or CAP_NET_ADMIN + CAP_SYS_ADMIN): $err"
fi
if ! err=$(ip -n "$switch" link add br0 type bridge 2>&1 &&
  ip netns add "$launcher" 2>&1 &&
  ip link add v0 netns "$switch" type veth peer name eth0 netns "$launcher" 2>&1); then
  skip "cannot create a bridge and veth links in network namespaces: $err"
fi
if ! err=$(ip netns exec "$launcher" unshare --uts hostname "$launcher" 2>&1); then
  skip "cannot give a namespace its own host name (unshare --uts): $err"
fi

# The network: a bridge in the switch namespace, one veth link to each namespace:
# the launcher at .254, host i at .(i+1).
set -e
ip -n "$switch" link set lo up
ip -n "$switch" link set br0 up
plug() {  # plug NS VETH ADDRESS
  ip -n "$switch" link set "$2" master br0 up
  ip -n "$1" addr add "$subnet.$3/24" dev eth0
  ip -n "$1" link set eth0 up
  ip -n "$1" link set lo up
}
plug "$launcher" v0 254
hostfile_lines=""
for ((i = 0; i < hosts; ++i)); do
  ns=${id}h$i
  ip netns add "$ns"
  ip link add "v$((i + 1))" netns "$switch" type veth peer name eth0 netns "$ns"
  plug "$ns" "v$((i + 1))" $((i + 1))
  if [ -n "$bench_rate" ] && [ "$bench_rate" != none ]; then
    # Both directions of the host's link: its egress, and the switch's egress towards it.
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$bench_rate" burst 1mb latency 100ms
    ip netns exec "$switch" tc qdisc add dev "v$((i + 1))" root tbf rate "$bench_rate" \
      burst 1mb latency 100ms
  fi
  hostfile_lines+="$ns slots=$per_host"$'\n'
done
set +e

scratch_run=$scratch/run$$
mkdir -p "$scratch_run/ckpt"
printf '%s' "$hostfile_lines" >"$scratch_run/hostfile"
np=$((hosts * per_host))
echo "hosts: $hosts namespaces (${id}h0..h$((hosts - 1))), $per_host rank(s) each, mpirun in $launcher;" \
  "network $subnet.0/24 over a bridge; checkpoint directory $scratch_run/ckpt"

# mpirun in the launcher namespace, under its own host name; the ranks on the hosts of the
# hostfile, placed host by host; TCP only, on the bridge's subnet. Run in the background and
# waited for, so that a signal to this script cleans up at once.
#   run_job SECONDS MPIRUN-ARGS...
run_job() {
  local limit=$1
  shift
  ip netns exec "$launcher" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$launcher" \
    timeout -k 15 "$limit" "$mpirun" --hostfile "${job_hostfile:-$scratch_run/hostfile}" \
    -np "${job_np:-$np}" --map-by slot \
    --mca plm_rsh_agent "$here/netns_rsh.sh" --mca plm_rsh_no_tree_spawn 1 \
    --mca pml ob1 --mca btl tcp,self --mca osc pt2pt \
    --mca btl_tcp_if_include "$subnet.0/24" --mca oob_tcp_if_include "$subnet.0/24" \
    --tag-output "$@"
}

if [ -n "$tier_mode" ]; then
  # Each host's memory: a tmpfs at one path, private to the host's mount namespace, which a
  # sleeping process holds (its pid in /run/dcp-mnt/<host>.pid, for netns_rsh.sh).
  tier=$scratch_run/tier
  mkdir -p "$tier" /run/dcp-mnt
  fresh_memory() {  # fresh_memory HOST: an empty tmpfs as the host's memory
    nsenter --mount="/proc/$(cat "/run/dcp-mnt/$1.pid")/ns/mnt" \
      sh -c 'umount "$0" 2>/dev/null; mount -t tmpfs -o size=1g tmpfs "$0"' "$tier"
  }
  for ((i = 0; i < hosts; ++i)); do
    unshare --mount --propagation private sleep 100000 &
    echo $! >"/run/dcp-mnt/${id}h$i.pid"
    disown $!  # ended by cleanup; no "Killed" line
    sleep 0.2  # the namespace exists once unshare has exec'd sleep
    fresh_memory "${id}h$i" || skip "cannot mount a tmpfs in a host's own mount namespace"
  done
  run_job 240 "$prog" save "$scratch_run/ckpt" "$tier" tp2,dp2 3 --persist-every 2 \
    --no-persist-at-exit --async >"$scratch_run/save.out" 2>&1 &
  wait $!
  rc=$?
  cat "$scratch_run/save.out"
  [ $rc -eq 0 ] || fail "the save job exited $rc"
  grep -q 'saved 3$' "$scratch_run/save.out" || fail "step 3 was not saved"
  [ -z "$(ls -A "$tier")" ] || fail "the hosts' memory is visible outside them: $(ls -A "$tier")"
  # Host 2 is lost: its processes are gone (the job ended), its memory is empty.
  fresh_memory "${id}h2"
  printf '%s\n' "${id}h0 slots=1" "${id}h1 slots=1" "${id}h3 slots=1" >"$scratch_run/hostfile3"
  job_hostfile=$scratch_run/hostfile3 job_np=3 run_job 240 "$prog" restore "$scratch_run/ckpt" \
    "$tier" tp3 --expect-step 3 --expect-memory yes --expect-no-storage \
    >"$scratch_run/restore.out" 2>&1 &
  wait $!
  rc=$?
  cat "$scratch_run/restore.out"
  [ $rc -eq 0 ] || fail "the restore job on 3 hosts exited $rc"
  grep -q 'restored 3 from memory' "$scratch_run/restore.out" || fail "no restore from memory"
  echo "mpi.hosts_memory_tier: PASSED (4 hosts with private memory, host 2 lost, restored on 3)"
  exit 0
fi

if [ -n "$bench_rate" ]; then
  run_job 540 "$prog" bench --dir "$scratch_run/ckpt" "${bench_args[@]}" &
  wait $!
  exit $?
fi

# Each rank says where it runs; then the tests.
run_job 120 hostname >"$scratch_run/hostnames.out" 2>&1 &
wait $!
rc=$?
cat "$scratch_run/hostnames.out"
[ $rc -eq 0 ] || fail "mpirun hostname exited $rc"
seen=$(sed -n 's/^\[[^]]*\]<stdout>:\(.*\)$/\1/p' "$scratch_run/hostnames.out" | sort -u | tr '\n' ' ')
[ "$(echo "$seen" | wc -w)" -eq "$hosts" ] || fail "ranks saw host names '$seen', want $hosts hosts"

run_job 420 -x DCP_TEST_HOSTS="$hosts" -x DCP_TEST_DIR="$scratch_run/ckpt" \
  "$prog" --gtest_filter='RealHostsMpi.*' --gtest_color=no >"$scratch_run/test.out" 2>&1 &
wait $!
rc=$?
cat "$scratch_run/test.out"
[ $rc -eq 124 ] || [ $rc -eq 137 ] && fail "the job did not end within 420 s"
[ $rc -eq 0 ] || fail "mpirun exited $rc"
grep -q "PASSED.*1 test" "$scratch_run/test.out" || fail "RealHostsMpi did not run"

# The broadcasts went over the hosts' links (TCP through the bridge), not through memory:
# the bytes the hosts received on them cover what had to cross hosts.
need=$(sed -n 's/.*crossing hosts: at least \([0-9]*\) bytes.*/\1/p' "$scratch_run/test.out")
[ -n "$need" ] || fail "the test did not say how many bytes cross hosts"
rx=0
for ((i = 0; i < hosts; ++i)); do
  b=$(ip netns exec "${id}h$i" cat /sys/class/net/eth0/statistics/rx_bytes)
  echo "${id}h$i: received $b bytes on its link"
  rx=$((rx + b))
done
[ "$rx" -ge "$need" ] || fail "the hosts' links carried $rx bytes in, less than the $need that must cross hosts"
echo "mpi.hosts: PASSED across hosts $seen($rx bytes received on the hosts' links, $need needed)"
