module github.com/baton-serving/baton/engine

go 1.26.0

replace (
	github.com/baton-serving/baton/gen => ../gen
	github.com/baton-serving/baton/kernels => ../kernels
	github.com/baton-serving/baton/kvtransfer => ../kvtransfer
	github.com/baton-serving/baton/svckit => ../svckit
	github.com/baton-serving/baton/tracing => ../tracing
)

require (
	github.com/baton-serving/baton/kernels v0.0.0-00010101000000-000000000000
	github.com/santhosh-tekuri/jsonschema/v6 v6.0.3
	go.uber.org/goleak v1.3.0
	pgregory.net/rapid v1.3.0
)

require (
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/text v0.14.0 // indirect
)
