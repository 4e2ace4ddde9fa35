package kvtransfer

import (
	"context"
	"testing"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

// A Send that completed before the context ended is reported as sent,
// not as the cancel: decode half-closing after PrefillDone ends prefill's
// transfer context while the writer reports the Send, and a random pick
// made successful transfers fail with "context canceled"
// (TestTransferOverGRPC flaked so under load).
func TestWriterSendPrefersCompletedSend(t *testing.T) {
	for i := range 64 {
		w := &writer{msgs: make(chan *batonv1.TransferKVResponse, 1), errs: make(chan error, 1)}
		w.errs <- nil // the writer's Send went out
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // and then the stream's end cancelled the transfer
		if err := w.send(ctx, &batonv1.TransferKVResponse{}, "prefill done"); err != nil {
			t.Fatalf("try %d: send = %v, want nil (the message went out)", i, err)
		}
	}
}
