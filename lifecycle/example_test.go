package lifecycle_test

import (
	"flag"
	"fmt"
	"strings"

	"github.com/quiesce-dev/quiesce/lifecycle"
)

func ExampleASAP() {
	// Handler "a" failed twice and "b" once; "c" has no progress yet, so zero retries.
	pending := []string{"a", "b", "c"}
	progress := map[string]lifecycle.Progress{
		"a": {Retries: 2},
		"b": {Retries: 1},
	}
	fmt.Println(lifecycle.ASAP(pending, progress))

	// Once "c" failed too, "b" and "c" tie: registration order decides.
	progress["c"] = lifecycle.Progress{Retries: 1}
	fmt.Println(lifecycle.ASAP(pending, progress))
	// Output:
	// [c]
	// [b]
}

func ExampleOneByOne() {
	progress := map[string]lifecycle.Progress{}
	all := []string{"create-bucket", "set-policy", "notify"}

	// Each cycle, the caller passes the handlers not yet done; OneByOne picks the first.
	for cycle := 1; ; cycle++ {
		var pending []string
		for _, id := range all {
			if !progress[id].Done {
				pending = append(pending, id)
			}
		}
		picked := lifecycle.OneByOne(pending, progress)
		if picked == nil {
			fmt.Println("all done")
			return
		}
		fmt.Println("cycle", cycle, "runs", picked)
		for _, id := range picked {
			progress[id] = lifecycle.Progress{Done: true}
		}
	}
	// Output:
	// cycle 1 runs [create-bucket]
	// cycle 2 runs [set-policy]
	// cycle 3 runs [notify]
	// all done
}

func ExampleAllAtOnce() {
	fmt.Println(lifecycle.AllAtOnce([]string{"a", "b", "c"}, nil))
	fmt.Println(lifecycle.AllAtOnce(nil, nil) == nil)
	// Output:
	// [a b c]
	// true
}

func ExampleNamed() {
	fs := flag.NewFlagSet("operator", flag.ContinueOnError)
	name := fs.String("lifecycle", "ASAP", "handler selection: one of "+strings.Join(lifecycle.Names(), ", "))
	_ = fs.Parse([]string{"--lifecycle=one-by-one"})

	fn, ok := lifecycle.Named(*name)
	if !ok {
		fmt.Println("unknown lifecycle", *name)
		return
	}
	fmt.Println(fn([]string{"a", "b"}, nil))
	// Output:
	// [a]
}
