//go:build linux

package realnode_test

import (
	"context"
	"fmt"

	"github.com/quiesce-dev/quiesce/realnode"
)

// Start runs only inside the namespaces that Main prepares (call it from TestMain); anywhere
// else it says so. See the package documentation for a suite's whole setup.
func ExampleStart() {
	node, err := realnode.Start(context.Background(), realnode.Options{
		Images: []realnode.Image{{Name: "localhost/operator:test", Package: "./cmd"}},
	})
	fmt.Println(node == nil, err)
	// Output: true failed to start a node: not inside the node's namespaces; call realnode.Main from TestMain
}
