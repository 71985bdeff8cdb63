package benchpair

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestInterleaved(t *testing.T) {
	var n1, n2 int
	var order []int
	var ratio float64
	res := testing.Benchmark(func(b *testing.B) {
		n1, n2, order = 0, 0, nil
		_, _, ratio = Interleaved(b, 3, "one", func(n int) {
			n1 += n
			order = append(order, 1)
		}, "two", func(n int) {
			n2 += n
			order = append(order, 2)
		})
	})
	if res.N == 0 || n1 != res.N || n2 != res.N {
		t.Fatalf("b.N = %d, ran %d and %d iterations; want b.N of each", res.N, n1, n2)
	}
	for i := 0; i+1 < len(order); i += 2 {
		if first := 1 + (i/2)%2; order[i] != first || order[i+1] != 3-first {
			t.Fatalf("block pair %d ran in order %v; want the first of each pair in turn", i/2, order[i:i+2])
		}
	}
	if _, ok := res.Extra["one-ns/op"]; !ok || ratio <= 0 {
		t.Errorf("metrics %v, ratio %v: want one-ns/op, two-ns/op and a positive ratio", res.Extra, ratio)
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 3}} {
		if got := median(tc.xs); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.xs, got, tc.want)
		}
	}
}
