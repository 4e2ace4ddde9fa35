// Package kvtransfer moves KV cache pages between a prefill worker and a
// decode worker over the PrefillService.TransferKV stream: chunking, credit
// based flow control, checksums, and both ends of the stream.
package kvtransfer
