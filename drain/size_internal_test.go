package drain

import (
	"testing"
	"unsafe"
)

// TestCallRecordSize keeps a call's record, the largest allocation of a call's tracking,
// within the 256-byte size class of the allocator.
func TestCallRecordSize(t *testing.T) {
	if n := unsafe.Sizeof(call{}); n > 256 {
		t.Errorf("a call record is %d bytes, want at most 256", n)
	}
}
