#!/usr/bin/env bash
# bench.sh measures the per-call budgets of issues 23, 31, 42 and 50, each as a pair run in the same process
# as its baseline (interleaved in short blocks, so that both see the same load on a busy
# machine; each run reports medians over its blocks), COUNT runs (default 5), and prints each
# budget with the median of the runs and whether it is met. `make bench` runs it.
# GO, COUNT and BENCHFLAGS (e.g. -cpu 2) may be set from the environment.
set -euo pipefail

GO="${GO:-go}"
COUNT="${COUNT:-5}"
BENCHFLAGS="${BENCHFLAGS:-}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
out="$(mktemp)"
trap 'rm -f "${out}"' EXIT

run() { # package, benchmark pattern, benchtime
	# shellcheck disable=SC2086 # BENCHFLAGS is a list of flags
	"${GO}" test -run '^$' -bench "$2" -benchtime "$3" -count "${COUNT}" ${BENCHFLAGS} "$1" | tee -a "${out}"
}
run ./drain/ '^BenchmarkCallInterleaved$' 200000x
run ./drain/ '^BenchmarkGoInterleaved$' 200000x
run ./drain/ '^BenchmarkGoSteadyInterleaved$' 200000x
run ./drain/ '^BenchmarkReportInterleaved$' 3x
run ./reconcilers/ '^BenchmarkReconcileDirectInterleaved$' 500000x
run ./reconcilers/ '^BenchmarkReconcileLoopInterleaved$' 100000x
run ./runnable/ '^BenchmarkAdmissionInterleaved$' 600x

# Lines: "BenchmarkName-P  N  value unit  value unit ...". The median of each (name, unit).
awk -v count="${COUNT}" '
function median(key,   n, i, j, t, a) {
	n = split(vals[key], a, " ")
	if (n == 0) { missing = 1; printf "no result for %s\n", key; return "nan" }
	for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
	return a[int((n + 1) / 2)]
}
function row(what, budget, got, met) {
	printf "%-68s %-10s %10s   %s\n", what, budget, got, met ? "met" : "NOT MET"
}
/^Benchmark/ {
	name = $1; sub(/-[0-9]+$/, "", name)
	for (i = 3; i + 1 <= NF; i += 2) vals[name SUBSEP $(i+1)] = vals[name SUBSEP $(i+1)] " " $i
}
END {
	printf "\nBudgets of issues 23, 31, 42 and 50: median of %d runs, each the median over its interleaved blocks\n\n", count
	printf "%-68s %-10s %10s   %s\n", "pair", "budget", "measured", ""
	call = median("BenchmarkCallInterleaved" SUBSEP "call/baseline")
	row("Call / (go + WaitGroup + channel)", "<= 1.8", sprintf("%.2f", call), call <= 1.8)
	ca = median("BenchmarkCallInterleaved" SUBSEP "call-allocs/op")
	ba = median("BenchmarkCallInterleaved" SUBSEP "baseline-allocs/op")
	row("Call allocations (the baseline in brackets)", "<= +2", sprintf("%.0f (%.0f)", ca, ba), ca <= ba + 2)
	gor = median("BenchmarkGoInterleaved" SUBSEP "go/errgroup")
	row("Go / errgroup.Group.Go", "<= 3", sprintf("%.2f", gor), gor <= 3)
	ga = median("BenchmarkGoInterleaved" SUBSEP "go-allocs/op")
	row("Go allocations (errgroup.Group.Go: 2)", "<= 3", sprintf("%.0f", ga), ga <= 3)
	gos = median("BenchmarkGoSteadyInterleaved" SUBSEP "go/errgroup")
	row("the same on one long-lived executor (no New nor Drain per block)", "reported", sprintf("%.2f", gos), 1)
	ns = median("BenchmarkReconcileDirectInterleaved" SUBSEP "over-ns/op")
	row("wrapped Reconcile called directly, over the bare call: ns", "<= 1000", sprintf("%.0f", ns), ns <= 1000)
	al = median("BenchmarkReconcileDirectInterleaved" SUBSEP "over-allocs/op")
	row("wrapped Reconcile called directly, over the bare call: allocs", "<= 4", sprintf("%.0f", al), al <= 4)
	by = median("BenchmarkReconcileDirectInterleaved" SUBSEP "over-B/op")
	row("wrapped Reconcile called directly, over the bare call: bytes", "reported", sprintf("%.0f", by), 1)
	w2 = median("BenchmarkReconcileLoopInterleaved/workers=2" SUBSEP "wrapped/unwrapped-throughput")
	row("controller-runtime loop, 2 workers: wrapped/unwrapped throughput", ">= 0.85", sprintf("%.2f", w2), w2 >= 0.85)
	w16 = median("BenchmarkReconcileLoopInterleaved/workers=16" SUBSEP "wrapped/unwrapped-throughput")
	row("the same, 16 workers on one executor (no lower than 0.85)", ">= 0.85", sprintf("%.2f", w16), w16 >= 0.85)
	wm = median("BenchmarkReconcileLoopInterleaved/workers=2,metrics" SUBSEP "wrapped/unwrapped-throughput")
	row("the same, 2 workers, executor of runnable.Setup (durations observed)", "reported", sprintf("%.2f", wm), 1)
	wf = median("BenchmarkReconcileLoopInterleaved/workers=2,floor" SUBSEP "wrapped/unwrapped-throughput")
	row("the same, 2 workers, the floor (alloc, clock, locked list) for Wrap", "reported", sprintf("%.2f", wf), 1)
	for (i = 1; i <= 2; i++) {
		sz = i == 1 ? "4KiB" : "1MiB"
		ad = median("BenchmarkAdmissionInterleaved/" sz SUBSEP "wrapped/unwrapped")
		row("admission request, " sz " object: wrapped / unwrapped time", "<= 1.10", sprintf("%.2f", ad), ad <= 1.10)
		am = median("BenchmarkAdmissionInterleaved/" sz SUBSEP "wrapped/unwrapped-B")
		row("the same: bytes allocated (no body copy)", "<= 1.1", sprintf("%.3f", am), am <= 1.1)
	}
	rep = median("BenchmarkReportInterleaved" SUBSEP "report/floor")
	row("report of 10,000 calls 150 frames deep / protobuf profile", "<= 2", sprintf("%.2f", rep), rep <= 2)
	if (missing) exit 1
}' "${out}"
