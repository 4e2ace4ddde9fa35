// Package deploy holds Baton's deployment files — Kubernetes manifests in
// k8s/ (a kustomize base, overlays and components) and the container images'
// Dockerfile in docker/ — and the tests that check them against the binaries
// they run. `go test` here needs no cluster and no Docker: it builds the
// services as the Dockerfile does, reads their flags from --help, decodes
// every manifest strictly into the Kubernetes API types, renders the
// overlays with kustomize and checks that ports, probes, flags, Services,
// discovery addresses and drain times line up.
package deploy
