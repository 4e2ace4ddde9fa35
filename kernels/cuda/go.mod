module github.com/baton-serving/baton/kernels/cuda

go 1.26.0

require (
	github.com/baton-serving/baton/kernels v0.0.0
	gorgonia.org/cu v0.9.6
)

require (
	github.com/google/uuid v1.1.1 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	golang.org/x/sys v0.50.0 // indirect
)

replace github.com/baton-serving/baton/kernels => ../
