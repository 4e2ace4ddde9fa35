package vec

// The amd64 kernels (dot_amd64.s, their stubs in dot_amd64.go and the tables
// in tiles_amd64.go) are generated with avo by a separate module, so that
// avo never becomes a dependency of the kernels module. scripts/gen-asm.sh
// --check, a step of scripts/test.sh, fails when they are stale.
//go:generate env GOWORK=off go -C ../internal/avogen run . -out ../../vec/dot_amd64.s -stubs ../../vec/dot_amd64.go -tables ../../vec/tiles_amd64.go -pkg vec
