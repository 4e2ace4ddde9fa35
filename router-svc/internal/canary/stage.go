package canary

import (
	"context"
	"fmt"
	"sync/atomic"
)

// Stage is where a probe waits: a probe that misses its deadline is judged
// by the worker its stage waits on, so that an overloaded worker is not
// taken for a stuck one, nor a stuck one for a busy one.
type Stage int32

const (
	// StageUnknown: the probe named no stage; either worker computing
	// makes a late probe busy.
	StageUnknown Stage = iota
	// StageAdmission: decode has not accepted the request yet.
	StageAdmission
	// StageFirstToken: page reservation at decode, the KV transfer and
	// prefill's compute, up to the first token.
	StageFirstToken
	// StageDecode: decode's own forward step, for the last token.
	StageDecode
)

func (s Stage) String() string {
	switch s {
	case StageUnknown:
		return "an unknown stage"
	case StageAdmission:
		return "admission"
	case StageFirstToken:
		return "the first token"
	case StageDecode:
		return "decode's step"
	}
	return fmt.Sprintf("Stage(%d)", int32(s))
}

type stageKey struct{}

// SetStage records, for the tracker that runs the probe, the stage the
// probe now waits in. A Probe calls it as it goes; outside a tracker's
// probe it does nothing.
func SetStage(ctx context.Context, s Stage) {
	if v, ok := ctx.Value(stageKey{}).(*atomic.Int32); ok {
		v.Store(int32(s))
	}
}
