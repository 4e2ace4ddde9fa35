// Package tests holds Baton's end-to-end suites. They build and start the real
// router, prefill and decode binaries on loopback ports and talk to them as a
// client would. They run under the e2e build tag (go test -tags e2e ./...).
package tests
