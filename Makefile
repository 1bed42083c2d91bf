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
# (docs/benchmarks.md) -> bench.json; the loads again on emulated slow shared storage
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

# Every benchmark whose tables docs/benchmarks.md shows, then those tables written, each
# stamped with its command, the version, the commit and this machine (scripts/bench_tables.py):
# `make bench`, incremental saves on 2 ranks, the memory tier on 4 emulated hosts (root reads
# capped at 0.5 GiB/s), and hyperdcp against torch DCP under torchrun (the Python package's
# test environment, $(BUILD)/py_venv, built by `make test`). About 20 minutes on 2 cores.
BENCH_INCREMENTAL = --layers 8 --width-scale 0.44 --phases incremental --repeat 5 --pause 0.5
BENCH_TIER = --layers 8 --width-scale 0.44 --phases tier --repeat 5 --pause 0.5 \
  --storage-gibps 0.5 --save-layout tp4 --load-layout tp2,dp2
BENCH_PYTHON = --size-mb 256 --repeat 3 --pause 0.5
PY_VENV = $(BUILD)/py_venv
bench-docs: bench
	mpirun -np 2 $(BUILD)/dcp bench $(BENCH_INCREMENTAL) --dir $(BENCH_DIR) --json bench-incremental.json
	OMPI_MCA_rmaps_base_oversubscribe=1 mpirun -np 4 sh -c 'DCP_HOST_ID=h$$OMPI_COMM_WORLD_RANK exec "$$0" "$$@"' \
	  $(BUILD)/dcp bench $(BENCH_TIER) --dir $(BENCH_DIR) --json bench-tier.json
	@test -x $(PY_VENV)/bin/python || { echo "bench-docs: $(PY_VENV) is missing: run make test first"; exit 1; }
	$(PY_VENV)/bin/pip install -q --no-build-isolation . -C build-dir=$(BUILD)/py_build
	OMP_NUM_THREADS=1 $(PY_VENV)/bin/python -m torch.distributed.run --nproc_per_node 4 \
	  -m hyperdcp.bench $(BENCH_PYTHON) --dir $(BENCH_DIR)/python --json bench-python.json
	python3 scripts/bench_tables.py --page docs/benchmarks.md --readme README.md \
	  --bench "bench.json:mpirun -np 4 dcp bench $(BENCH_MAIN)" \
	  --bench "bench-throttled.json:mpirun -np 4 dcp bench $(BENCH_THROTTLED)" \
	  --bench "bench-incremental.json:mpirun -np 2 dcp bench $(BENCH_INCREMENTAL)" \
	  --bench "bench-tier.json:mpirun -np 4 (DCP_HOST_ID=h<rank>) dcp bench $(BENCH_TIER)" \
	  $(foreach j,1 2 3 4,--simulate "simulate-$(j).json:dcp simulate $(SIMULATE_$(j))") \
	  --python "bench-python.json:torchrun --nproc_per_node 4 -m hyperdcp.bench $(BENCH_PYTHON)"

# Whole-job planning at scale (docs/benchmarks.md, "dcp simulate"): balance, collective calls
# per rank and metadata of the three 16,384/131,072-rank jobs and of a one-rank checkpoint
# loaded by 64 replicas -> simulate-N.json. About 15 s.
SIMULATE_1 = --layers 48 --ranks 16384 --save-layout tp8,ep8,dp256 --load-layout tp4,dp4096
SIMULATE_2 = --model dense-500b --layers 126 --optimizer --ranks 16384 --save-layout tp8,dp2048
SIMULATE_3 = --model dense-500b --layers 126 --optimizer --ranks 131072 --save-layout tp8,dp16384
SIMULATE_4 = --layers 48 --ranks 64 --ranks-per-host 8 --save-layout dp1 --load-layout dp64
bench-simulate: build
	$(foreach j,1 2 3 4,$(BUILD)/dcp simulate $(SIMULATE_$(j)) --json simulate-$(j).json &&) true

bench-metadata: build
	$(BUILD)/bench/metadata_bench

# Each fuzz target for FUZZ_SECONDS (clang++ -fsanitize=fuzzer; see scripts/fuzz.sh).
FUZZ_SECONDS ?= 60
fuzz: setup
	./scripts/fuzz.sh run $(BUILD)/fuzz $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD)
