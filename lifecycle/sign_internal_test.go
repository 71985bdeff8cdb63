package lifecycle

import "testing"

// TestCheckFieldsSaysWhich: a field twice is reported as such, a field spelt in another case
// as that spelling; before, both as "appears twice or spelt".
func TestCheckFieldsSaysWhich(t *testing.T) {
	for raw, want := range map[string]string{
		`{"generation":1,"handlers":{},"handlers":{},"mac":"v2:x"}`: `failed to verify progress: field "handlers" appears twice`,
		`{"mac":"v2:x","generation":1,"mac":"v2:y"}`:                `failed to verify progress: field "mac" appears twice`,
		`{"generation":1,"HANDLERS":{},"mac":"v2:x"}`:               `failed to verify progress: field "handlers" spelt "HANDLERS"`,
		`{"generation":1,"handlers":{},"Handlers":{}}`:              `failed to verify progress: field "handlers" spelt "Handlers"`,
		`{"Generation":1}`: `failed to verify progress: field "generation" spelt "Generation"`,
	} {
		if err := checkFields(raw); err == nil || err.Error() != want {
			t.Errorf("checkFields(%s) = %v, want %q", raw, err, want)
		}
	}
	if err := checkFields(`{"generation":1,"handlers":{},"mac":"v2:x","other":1}`); err != nil {
		t.Errorf("checkFields of a well-formed record = %v, want nil", err)
	}
}
