module github.com/baton-serving/baton/tests

go 1.26.0

replace (
	github.com/baton-serving/baton/engine => ../engine
	github.com/baton-serving/baton/gen => ../gen
	github.com/baton-serving/baton/kernels => ../kernels
	github.com/baton-serving/baton/kernels/cuda => ../kernels/cuda
	github.com/baton-serving/baton/kvtransfer => ../kvtransfer
	github.com/baton-serving/baton/svckit => ../svckit
	github.com/baton-serving/baton/tracing => ../tracing
)

require (
	github.com/baton-serving/baton/engine v0.0.0-00010101000000-000000000000
	github.com/baton-serving/baton/gen v0.0.0-00010101000000-000000000000
	github.com/baton-serving/baton/svckit v0.0.0-00010101000000-000000000000
	github.com/prometheus/client_model v0.6.3
	github.com/prometheus/common v0.73.1
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/baton-serving/baton/kernels v0.0.0 // indirect
	github.com/grpc-ecosystem/grpc-gateway/v2 v2.33.0 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/pandatix/go-abnf v0.5.3 // indirect
	golang.org/x/net v0.61.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20261026165753-2ffab32bce7e // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261019180522-ce908d29299b // indirect
)
