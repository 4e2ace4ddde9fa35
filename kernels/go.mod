module github.com/baton-serving/baton/kernels

go 1.26.0
