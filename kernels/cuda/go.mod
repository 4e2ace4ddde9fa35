module github.com/baton-serving/baton/kernels/cuda

go 1.26.0

require github.com/baton-serving/baton/kernels v0.0.0

replace github.com/baton-serving/baton/kernels => ../
