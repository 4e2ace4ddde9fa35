module github.com/baton-serving/baton/cmd/batonctl

go 1.26.0

replace (
	github.com/baton-serving/baton/gen => ../../gen
	github.com/baton-serving/baton/kernels => ../../kernels
	github.com/baton-serving/baton/engine => ../../engine
	github.com/baton-serving/baton/kvtransfer => ../../kvtransfer
	github.com/baton-serving/baton/tracing => ../../tracing
	github.com/baton-serving/baton/svckit => ../../svckit
)
