# Entry points: `make demo` and `make test` install what is missing, build, and run.
BUILD ?= build
JOBS ?= $(shell nproc)
# Open MPI refuses to run as root unless told; --oversubscribe lets 4 ranks share 2 cores.
export OMPI_ALLOW_RUN_AS_ROOT = 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM = 1
export OMPI_MCA_rmaps_base_oversubscribe = 1

.PHONY: all setup build demo test bench bench-docs bench-metadata bench-simulate fuzz clean

all: build

setup:
	@./scripts/setup.sh

$(BUILD)/CMakeCache.txt: | setup
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo

build: setup $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# The demo needs the CLI only, not the tests and benchmarks.
demo: setup $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS) --target dcp_cli
	$(BUILD)/dcp demo --layers 2
	mpirun -np 4 $(BUILD)/dcp demo

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# `dcp bench` on 4 ranks: the Qwen3-30B-A3B shape at ~2 GiB unique (8 layers, width x0.44),
# every phase next to the physical limit of the same directory measured in the same run
# (README.md, "Benchmarks") -> bench.json; the loads again on emulated slow shared storage
# (0.5 GiB/s aggregate), where read-once broadcast pays -> bench-throttled.json; then the
# metadata codec benchmark. About 8 minutes on 2 cores.
BENCH_DIR ?= $(BUILD)/bench-data
BENCH_ARGS ?= --layers 8 --width-scale 0.44 --save-layout tp2,dp2 --load-layout ep4 --pause 3
# The two runs' own arguments, also the commands bench-docs stamps on their tables.
BENCH_MAIN = $(BENCH_ARGS) --phases save,async,load,reshard,manager --repeat 5
BENCH_THROTTLED = $(BENCH_ARGS) --phases load,reshard --repeat 3 --storage-gibps 0.5
bench: build
	mpirun -np 4 $(BUILD)/dcp bench $(BENCH_MAIN) --dir $(BENCH_DIR) --json bench.json
	mpirun -np 4 $(BUILD)/dcp bench $(BENCH_THROTTLED) --dir $(BENCH_DIR) --json bench-throttled.json
	$(BUILD)/bench/metadata_bench
	$(MAKE) bench-simulate

# `make bench`, then its two reports written into docs/benchmarks.md's current tables, each
# stamped with its command, the version, the commit and this machine (scripts/bench_tables.py).
bench-docs: bench
	python3 scripts/bench_tables.py --page docs/benchmarks.md \
	  "bench.json:mpirun -np 4 dcp bench $(BENCH_MAIN)" \
	  "bench-throttled.json:mpirun -np 4 dcp bench $(BENCH_THROTTLED)"

# Whole-job planning at scale (README.md, "dcp simulate"): balance, collective calls per rank
# and metadata of the three 16,384/131,072-rank jobs and of a one-rank checkpoint loaded by 64
# replicas. About 15 s.
bench-simulate: build
	$(BUILD)/dcp simulate --layers 48 --ranks 16384 --save-layout tp8,ep8,dp256 --load-layout tp4,dp4096
	$(BUILD)/dcp simulate --model dense-500b --layers 126 --optimizer --ranks 16384 --save-layout tp8,dp2048
	$(BUILD)/dcp simulate --model dense-500b --layers 126 --optimizer --ranks 131072 --save-layout tp8,dp16384
	$(BUILD)/dcp simulate --layers 48 --ranks 64 --save-layout dp1 --load-layout dp64

bench-metadata: build
	$(BUILD)/bench/metadata_bench

# Each fuzz target for FUZZ_SECONDS (clang++ -fsanitize=fuzzer; see scripts/fuzz.sh).
FUZZ_SECONDS ?= 60
fuzz: setup
	./scripts/fuzz.sh run $(BUILD)/fuzz $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD)
