package vec

import (
	"slices"
	"testing"
)

func TestSetImplementation(t *testing.T) {
	names := Implementations()
	if len(names) == 0 || names[0] != Implementation() || names[len(names)-1] != "purego" {
		t.Fatalf("Implementations() = %v with %q active: want the active one first and purego last", names, Implementation())
	}
	x := []float32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	want := DotF32(x, x)
	for _, name := range names {
		restore, err := SetImplementation(name)
		if err != nil {
			t.Fatal(err)
		}
		if Implementation() != name {
			t.Errorf("after SetImplementation(%q): Implementation() = %q", name, Implementation())
		}
		if got := DotF32(x, x); got != want {
			t.Errorf("%s: DotF32 = %g, want %g", name, got, want)
		}
		restore()
		if Implementation() != names[0] {
			t.Errorf("restore after %q: Implementation() = %q, want %q", name, Implementation(), names[0])
		}
	}
	if _, err := SetImplementation("sse9"); err == nil || Implementation() != names[0] {
		t.Errorf("SetImplementation(\"sse9\"): err %v, active %q", err, Implementation())
	}
	if slices.Contains(names, "") {
		t.Errorf("an implementation has no name: %v", names)
	}
}
