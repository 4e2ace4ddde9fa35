module github.com/baton-serving/baton/deploy

go 1.26.0
