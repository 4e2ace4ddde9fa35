package dockerfile

import (
	"strings"
	"testing"
)

const sample = `# syntax=docker/dockerfile:1.7
ARG GO_VERSION=1.26.8
# a comment
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ENV CGO_ENABLED=0 \
    GOFLAGS=-buildvcs=false
RUN --mount=type=cache,target=/root/.cache \
    # comments inside a continuation are dropped
    go build -o /out/ ./a ./b

FROM gcr.io/distroless/static-debian12:nonroot AS a
COPY --from=build /out/a /usr/local/bin/a
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/a"]
`

func TestParse(t *testing.T) {
	f, err := Parse(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Args) != 1 || f.Args[0].Args != "GO_VERSION=1.26.8" {
		t.Errorf("global ARGs = %+v", f.Args)
	}
	if len(f.Stages) != 2 {
		t.Fatalf("%d stages, want 2", len(f.Stages))
	}
	b, ok := f.Stage("build")
	if !ok || b.Base != "golang:${GO_VERSION}" || b.Platform != "$BUILDPLATFORM" {
		t.Fatalf("build stage = %+v", b)
	}
	env, err := b.Env()
	if err != nil || env["CGO_ENABLED"] != "0" || env["GOFLAGS"] != "-buildvcs=false" {
		t.Errorf("Env = %v, %v", env, err)
	}
	runs := b.Find("RUN")
	if len(runs) != 1 || runs[0].Line != 7 || runs[0].Args != "--mount=type=cache,target=/root/.cache go build -o /out/ ./a ./b" {
		t.Errorf("RUN = %+v", runs)
	}
	a, _ := f.Stage("a")
	argv, err := ExecForm(a.Find("ENTRYPOINT")[0])
	if err != nil || len(argv) != 1 || argv[0] != "/usr/local/bin/a" {
		t.Errorf("ENTRYPOINT = %q, %v", argv, err)
	}
}

func TestParseErrors(t *testing.T) {
	for name, text := range map[string]string{
		"empty":                "# nothing\n",
		"instruction first":    "RUN true\nFROM x\n",
		"dangling backslash":   "FROM x\nRUN a \\\n",
		"FROM with extra args": "FROM x AS y z\n",
	} {
		if _, err := Parse(strings.NewReader(text)); err == nil {
			t.Errorf("%s: parsed without an error", name)
		}
	}
	if _, err := ExecForm(Instruction{Cmd: "ENTRYPOINT", Args: "/bin/a --flag"}); err == nil {
		t.Error("shell-form ENTRYPOINT accepted")
	}
	s := Stage{Instructions: []Instruction{{Cmd: "ENV", Args: "A"}}}
	if _, err := s.Env(); err == nil {
		t.Error("ENV without = accepted")
	}
}
