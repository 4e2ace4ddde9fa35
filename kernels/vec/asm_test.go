package vec

import (
	"bufio"
	"os"
	"regexp"
	"strings"
	"testing"
)

// The AVX2 kernels must run on CPUs without AVX-512, so they may use only
// the 16 VEX-encodable vector registers. avo allocates from all 32, so this
// is checked on the generated text. No kernel may touch BP (the frame
// pointer) or R15 (clobbered by dynamic linking).
func TestAsmRegisters(t *testing.T) {
	f, err := os.Open("dot_amd64.s")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	evexOnly := regexp.MustCompile(`\b([XY](1[6-9]|2[0-9]|3[01])|Z[0-9]+|K[1-7])\b`)
	banned := regexp.MustCompile(`\b(BP|R15)\b`)
	var fn string
	funcs := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "TEXT ") {
			fn = strings.Fields(line)[1]
			funcs++
			continue
		}
		if banned.MatchString(line) {
			t.Errorf("%s uses BP or R15: %s", fn, strings.TrimSpace(line))
		}
		if strings.Contains(fn, "AVX2") && evexOnly.MatchString(line) {
			t.Errorf("%s uses an AVX-512 register: %s", fn, strings.TrimSpace(line))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if funcs < 100 {
		t.Fatalf("found only %d functions in dot_amd64.s", funcs)
	}
}
