#!/usr/bin/env bash
# Jobs that must end, under real mpirun: a stopped rank, MPI below MPI_THREAD_MULTIPLE, and an
# error every rank agrees on (printed once). Hang guards only, no timing assertions.
#   hang_test.sh MPIRUN HANG_MPI_TEST DCP_CLI SCRATCH
set -u
mpirun=$1 prog=$2 cli=$3 scratch=$4
rm -rf "$scratch" && mkdir -p "$scratch"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
fail=0
check() {  # check NAME CONDITION-TEXT: prints and records a failure
  echo "FAIL: $1"; fail=1
}

# 1. One rank stops itself (SIGSTOP) before a collective: the others time out after 3 s,
#    name rank 3, and the job ends: mpirun returns non-zero (not killed by the guard).
timeout -k 20 240 "$mpirun" -np 4 --oversubscribe "$prog" absent 3 >"$scratch/absent.out" 2>&1
rc=$?
echo "absent: mpirun exit $rc"
[ "$rc" -ne 0 ] || check "absent: mpirun exited 0"
[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || check "absent: the job hung (killed by the 240 s guard)"
grep -q "rank(s) 3 of 4 did not arrive" "$scratch/absent.out" ||
  check "absent: no rank named the stopped rank 3"
grep -q "AllGather" "$scratch/absent.out" || check "absent: the operation is not named"

# 2. MPI initialized with MPI_THREAD_FUNNELED by the program: async save fails clearly.
timeout -k 20 240 "$mpirun" -np 4 --oversubscribe "$prog" funneled "$scratch/funneled" \
  >"$scratch/funneled.out" 2>&1
rc=$?
echo "funneled: mpirun exit $rc"
[ "$rc" -eq 0 ] || check "funneled: async save below MPI_THREAD_MULTIPLE did not fail clearly"

# 3. An error every rank agrees on is printed once (by rank 0), and the job fails.
timeout -k 20 240 "$mpirun" -np 4 --oversubscribe "$cli" convert "$scratch/no-such-ckpt" \
  "$scratch/out" >"$scratch/cli.out" 2>"$scratch/cli.err"
rc=$?
echo "cli: mpirun exit $rc"
copies=$(grep -c "^dcp " "$scratch/cli.err")
[ "$rc" -ne 0 ] || check "cli: failed command exited 0"
[ "$copies" -eq 1 ] || check "cli: $copies copies of the error on stderr, want 1"

for f in absent.out funneled.out cli.err; do echo "--- $f"; cat "$scratch/$f"; done
exit $fail
