package measure

import (
	"reflect"
	"testing"
	"time"
)

// at is a moment ms milliseconds after a fixed origin.
func at(ms float64) time.Time {
	return time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC).Add(time.Duration(ms * float64(time.Millisecond)))
}

func chunks(tokens map[float64]int, order ...float64) []Chunk {
	var cs []Chunk
	for _, ms := range order {
		cs = append(cs, Chunk{At: at(ms), Tokens: tokens[ms]})
	}
	return cs
}

// fixture is a run of six requests whose figures are worked out by hand in
// TestSummarizeExact.
func fixture() []Sample {
	return []Sample{
		// TTFT 100, E2E 205, TPOT (200-100)/4 = 25, ITL 30, 20, 20, 30.
		{Start: at(0), End: at(205), InputTokens: 10, OutputTokens: 5,
			Chunks: chunks(map[float64]int{100: 1, 130: 1, 170: 2, 200: 1}, 100, 130, 170, 200)},
		// TTFT 200, E2E 250, TPOT (290-250)/2 = 20, ITL 10, 30.
		{Start: at(50), End: at(300), InputTokens: 20, OutputTokens: 3,
			Chunks: chunks(map[float64]int{250: 1, 260: 1, 290: 1}, 250, 260, 290)},
		// TTFT 100, E2E 110, one token: no TPOT, no ITL.
		{Start: at(60), End: at(170), InputTokens: 5, OutputTokens: 1,
			Chunks: chunks(map[float64]int{160: 1}, 160)},
		{Start: at(70), End: at(80), Err: "boom"},
		{Start: at(75), End: at(90), Err: "boom", Chunks: chunks(map[float64]int{85: 1}, 85)},
		{Start: at(80), End: at(95)},
	}
}

func TestSummarizeExact(t *testing.T) {
	slo, err := ParseSLO("ttft:150,tpot:22")
	if err != nil {
		t.Fatal(err)
	}
	got := Summarize(fixture(), at(0), at(300), slo)
	want := Summary{
		Completed: 3, Failed: 3,
		Errors:          []ErrorCount{{"boom", 2}, {"stream ended without output", 1}},
		DurationSeconds: 0.3, InputTokens: 35, OutputTokens: 9,
		RequestThroughput: 3 / 0.3, InputThroughput: 35 / 0.3, OutputThroughput: 9 / 0.3, TotalThroughput: 44 / 0.3,
		Concurrency: (205.0 + 250 + 110) / 300,
		// sorted 100, 100, 200; rank p(n-1)/100 interpolated.
		TTFT: Dist{N: 3, Mean: 400.0 / 3, Median: 100, P90: 100 + 100*0.8, P99: 100 + 100*0.98, Min: 100, Max: 200},
		// sorted 20, 25.
		TPOT: Dist{N: 2, Mean: 22.5, Median: 22.5, P90: 20 + 5*0.9, P99: 20 + 5*0.99, Min: 20, Max: 25},
		// sorted 10, 20, 20, 30, 30, 30.
		ITL: Dist{N: 6, Mean: 140.0 / 6, Median: 25, P90: 30, P99: 30, Min: 10, Max: 30},
		// sorted 110, 205, 250.
		E2E: Dist{N: 3, Mean: 565.0 / 3, Median: 205, P90: 205 + 45*0.8, P99: 205 + 45*0.98, Min: 110, Max: 250},
		// Only the third request meets both objectives (the first misses
		// TPOT, the second TTFT).
		Good: 1, Goodput: 1 / 0.3,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Summarize:\n got %+v\nwant %+v", got, want)
	}
}

func TestSampleFigures(t *testing.T) {
	s := fixture()[0]
	if got := s.TTFT(); got != 100*time.Millisecond {
		t.Errorf("TTFT = %v, want 100ms", got)
	}
	if got := s.E2E(); got != 205*time.Millisecond {
		t.Errorf("E2E = %v, want 205ms", got)
	}
	if got, ok := s.TPOT(); !ok || got != 25 {
		t.Errorf("TPOT = %v, %v; want 25, true", got, ok)
	}
	if got, want := s.ITL(), []float64{30, 20, 20, 30}; !reflect.DeepEqual(got, want) {
		t.Errorf("ITL = %v, want %v", got, want)
	}
	// A stream without token counts (OpenAI text chunks): one gap per chunk.
	s.Chunks = chunks(nil, 100, 130, 170, 200)
	if got, want := s.ITL(), []float64{30, 40, 30}; !reflect.DeepEqual(got, want) {
		t.Errorf("ITL without counts = %v, want %v", got, want)
	}
	one := fixture()[2]
	if _, ok := one.TPOT(); ok {
		t.Error("a one-token request has a TPOT")
	}
}

func TestSummarizeEdges(t *testing.T) {
	t.Run("nothing completed", func(t *testing.T) {
		got := Summarize(fixture()[3:], at(0), at(100), SLO{})
		if got.Completed != 0 || got.Failed != 3 || got.RequestThroughput != 0 || got.TTFT != (Dist{}) {
			t.Errorf("got %+v", got)
		}
	})
	t.Run("zero duration", func(t *testing.T) {
		got := Summarize(fixture()[:1], at(0), at(0), SLO{})
		if got.RequestThroughput != 0 || got.Completed != 1 {
			t.Errorf("got %+v", got)
		}
	})
	t.Run("no SLO counts nothing good", func(t *testing.T) {
		if got := Summarize(fixture(), at(0), at(300), SLO{}); got.Good != 0 || got.Goodput != 0 {
			t.Errorf("good %d goodput %v without an SLO", got.Good, got.Goodput)
		}
	})
	t.Run("single value", func(t *testing.T) {
		got := Summarize(fixture()[2:3], at(0), at(300), SLO{})
		if want := (Dist{N: 1, Mean: 100, Median: 100, P90: 100, P99: 100, Min: 100, Max: 100}); got.TTFT != want {
			t.Errorf("TTFT %+v, want %+v", got.TTFT, want)
		}
	})
}

func TestParseSLO(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    SLO
		wantErr bool
	}{
		{in: "", want: SLO{}},
		{in: "ttft:50", want: SLO{TTFT: 50 * time.Millisecond}},
		{in: "ttft:500,tpot:12.5", want: SLO{TTFT: 500 * time.Millisecond, TPOT: 12500 * time.Microsecond}},
		{in: " TPOT : 0.001 , e2e:2000", want: SLO{TPOT: time.Microsecond, E2E: 2 * time.Second}},
		{in: "e2el:1", want: SLO{E2E: time.Millisecond}},
		{in: "ttft", wantErr: true},
		{in: "ttft:-1", wantErr: true},
		{in: "ttft:0", wantErr: true},
		{in: "ttft:abc", wantErr: true},
		{in: "itl:5", wantErr: true},
		{in: "ttft:0.0000001", wantErr: true},
	} {
		got, err := ParseSLO(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("ParseSLO(%q) = %+v, %v; want %+v, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
		if err == nil {
			back, err := ParseSLO(got.String())
			if err != nil || back != got {
				t.Errorf("ParseSLO(%q.String() = %q) = %+v, %v", tc.in, got.String(), back, err)
			}
		}
	}
}

func TestSLOMet(t *testing.T) {
	s := fixture()[0] // TTFT 100, TPOT 25, E2E 205
	for _, tc := range []struct {
		slo  SLO
		want bool
	}{
		{SLO{TTFT: 100 * time.Millisecond}, true}, // at the objective is within it
		{SLO{TTFT: 100*time.Millisecond - 1}, false},
		{SLO{TPOT: 25 * time.Millisecond}, true},
		{SLO{TPOT: 25*time.Millisecond - 1}, false},
		{SLO{E2E: 205 * time.Millisecond}, true},
		{SLO{E2E: 204 * time.Millisecond}, false},
		{SLO{TTFT: time.Second, TPOT: time.Second, E2E: time.Second}, true},
	} {
		if got := tc.slo.Met(&s); got != tc.want {
			t.Errorf("%+v.Met = %v, want %v", tc.slo, got, tc.want)
		}
	}
}
