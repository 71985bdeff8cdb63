package benchpair

import (
	"slices"
	"testing"
	"time"
)

// Interleaved runs b.N iterations of each of two cases, alternately, block at a time (the
// first of each pair in turn). It reports the median over the blocks of each case's ns/op
// as name1-ns/op and name2-ns/op, in place of ns/op, and returns those medians and the
// median ratio of the first's time to the second's. run1 and run2 run n iterations.
func Interleaved(
	b *testing.B, block int, name1 string, run1 func(n int), name2 string, run2 func(n int),
) (ns1, ns2, ratio float64) {
	b.Helper()
	var per1, per2, ratios []float64
	b.ResetTimer()
	for done := 0; done < b.N; {
		n := min(block, b.N-done)
		var t1, t2 time.Duration
		if len(ratios)%2 == 0 {
			t1, t2 = timed(run1, n), timed(run2, n)
		} else {
			t2, t1 = timed(run2, n), timed(run1, n)
		}
		per1 = append(per1, float64(t1.Nanoseconds())/float64(n))
		per2 = append(per2, float64(t2.Nanoseconds())/float64(n))
		ratios = append(ratios, float64(t1)/float64(max(t2, 1)))
		done += n
	}
	b.StopTimer()
	ns1, ns2, ratio = median(per1), median(per2), median(ratios)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(ns1, name1+"-ns/op")
	b.ReportMetric(ns2, name2+"-ns/op")
	return ns1, ns2, ratio
}

func timed(run func(n int), n int) time.Duration {
	t0 := time.Now()
	run(n)
	return time.Since(t0)
}

// median returns the median of xs (the upper one of an even count), sorting xs; 0 if empty.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	return xs[len(xs)/2]
}
