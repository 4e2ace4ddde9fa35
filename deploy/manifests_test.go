package deploy

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/baton-serving/baton/deploy/internal/dockerfile"
	"github.com/baton-serving/baton/deploy/internal/manifest"
	"github.com/baton-serving/baton/engine/modelfile"
	"github.com/baton-serving/baton/engine/refdata"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	kusttypes "sigs.k8s.io/kustomize/api/types"
)

// overlays are the kustomizations an operator applies, with the worker
// counts each must produce.
var overlays = []struct {
	dir             string
	prefill, decode int32
	tracing         bool // includes the jaeger component
	routersAtLeast  int32
}{
	{"k8s/overlays/small", 1, 1, true, 1},
	{"k8s/overlays/fleet", 2, 4, false, 2},
}

func TestMain(m *testing.M) {
	code := m.Run()
	// Both are this binary's alone, and the secrets hold private keys:
	// nothing of either outlives the run.
	for _, dir := range []string{built.dir, devSecrets.dir} {
		if dir != "" {
			os.RemoveAll(dir)
		}
	}
	os.Exit(code)
}

// built holds the service binaries, compiled once per test binary.
var built struct {
	once  sync.Once
	dir   string
	flags map[string]manifest.FlagSet
	err   error
}

// parseDockerfile reads deploy/docker/Dockerfile.
func parseDockerfile(t testing.TB) *dockerfile.File {
	t.Helper()
	f, err := os.Open("docker/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	df, err := dockerfile.Parse(f)
	if err != nil {
		t.Fatalf("docker/Dockerfile: %v", err)
	}
	return df
}

// binaries builds router-svc, prefill-svc and decode-svc the way the
// Dockerfile's build stage does (its ENV: CGO_ENABLED=0 and the rest) and
// reads each one's flags from its --help.
func binaries(t testing.TB) (string, map[string]manifest.FlagSet) {
	t.Helper()
	built.once.Do(func() {
		root := refdata.RepoRoot(t)
		df := parseDockerfile(t)
		st, ok := df.Stage("build")
		if !ok {
			built.err = errors.New("docker/Dockerfile has no build stage")
			return
		}
		env, err := st.Env()
		if err != nil {
			built.err = err
			return
		}
		dir, err := os.MkdirTemp("", "baton-deploy-test-")
		if err != nil {
			built.err = err
			return
		}
		built.dir = dir
		args := []string{"build", "-trimpath", "-o", dir + string(os.PathSeparator)}
		for _, bin := range manifest.Binaries {
			args = append(args, "github.com/baton-serving/baton/"+bin)
		}
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		cmd.Env = os.Environ()
		for k, v := range env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		start := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build (as the Dockerfile): %v\n%s", err, out)
			return
		}
		t.Logf("built the services in %v", time.Since(start).Round(time.Millisecond))
		built.flags = map[string]manifest.FlagSet{}
		for _, bin := range manifest.Binaries {
			var stderr bytes.Buffer
			cmd := exec.Command(filepath.Join(dir, bin), "--help")
			cmd.Stderr, cmd.Stdout = &stderr, &stderr
			if err := cmd.Run(); err != nil {
				built.err = fmt.Errorf("%s --help: %v\n%s", bin, err, stderr.String())
				return
			}
			fs, err := manifest.ParseHelp(stderr.String())
			if err != nil {
				built.err = fmt.Errorf("%s --help: %w", bin, err)
				return
			}
			built.flags[bin] = fs
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.dir, built.flags
}

func checkConfig(t testing.TB) manifest.Config {
	_, flags := binaries(t)
	return manifest.Config{Flags: flags, LibraryEnv: []string{modelfile.EnvCacheDir, modelfile.EnvHFEndpoint}}
}

func render(t testing.TB, dir string) manifest.Bundle {
	t.Helper()
	objs, err := manifest.Render(dir)
	if err != nil {
		t.Fatal(err)
	}
	return manifest.Bundle{Objects: objs}
}

// TestEveryManifestDecodesStrictly decodes every document of every YAML file
// under k8s/ into its Kubernetes API type (or kustomize's Kustomization),
// failing on unknown, misspelt or duplicate fields.
func TestEveryManifestDecodesStrictly(t *testing.T) {
	files, err := manifest.DecodeTree("k8s")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 8 {
		t.Fatalf("found %d YAML files under k8s/, expected the base, the jaeger component and two overlays", len(files))
	}
	for path, objs := range files {
		if len(objs) == 0 {
			t.Errorf("%s: holds no object", path)
		}
		isKust := filepath.Base(path) == "kustomization.yaml"
		for _, o := range objs {
			if _, ok := o.Obj.(*kusttypes.Kustomization); ok != isKust {
				t.Errorf("%s: a %s in a file named %s", o.Source, o.Kind, filepath.Base(path))
			}
		}
	}
}

// TestOverlays renders the base and each overlay with kustomize and checks
// the result against the service binaries, and the overlays' worker counts.
func TestOverlays(t *testing.T) {
	cfg := checkConfig(t)
	for _, dir := range append([]string{"k8s/base"}, func() []string {
		var ds []string
		for _, o := range overlays {
			ds = append(ds, o.dir)
		}
		return ds
	}()...) {
		t.Run(dir, func(t *testing.T) {
			b := render(t, dir)
			for _, err := range manifest.Check(b, cfg) {
				t.Error(err)
			}
		})
	}
	for _, o := range overlays {
		t.Run(o.dir+"/replicas", func(t *testing.T) {
			b := render(t, o.dir)
			for _, want := range []struct {
				comp string
				n    int32
			}{{"prefill", o.prefill}, {"decode", o.decode}} {
				if got, ok := b.Replicas(want.comp); !ok || got != want.n {
					t.Errorf("%s replicas = %d (one Deployment: %v), want %d", want.comp, got, ok, want.n)
				}
			}
			if got, ok := b.Replicas("router"); !ok || got < o.routersAtLeast {
				t.Errorf("router replicas = %d, want at least %d", got, o.routersAtLeast)
			}
			ws, errs := b.Workloads()
			if len(errs) > 0 {
				t.Fatal(errs)
			}
			_, hasJaeger := b.Replicas("jaeger")
			if hasJaeger != o.tracing {
				t.Errorf("Jaeger deployed: %v, want %v", hasJaeger, o.tracing)
			}
			for _, w := range ws {
				if _, ok := w.Env["OTEL_EXPORTER_OTLP_ENDPOINT"]; ok != o.tracing {
					t.Errorf("%s: OTLP endpoint set: %v, want %v", w, ok, o.tracing)
				}
			}
		})
	}
}

// TestServicesAcceptTheirConfiguration runs each binary with exactly the
// BATON_* environment and args its container gets, overriding only the
// listen addresses (ephemeral loopback ports) and the model (a missing
// file). Flag parsing and every service's Validate then run on the real
// configuration; start-up must get as far as opening the model and fail
// there, and nowhere earlier.
func TestServicesAcceptTheirConfiguration(t *testing.T) {
	dir, _ := binaries(t)
	missing := filepath.Join(t.TempDir(), "no-such-model.gguf")
	for _, o := range overlays {
		b := render(t, o.dir)
		ws, errs := b.Workloads()
		if len(errs) > 0 {
			t.Fatal(errs)
		}
		for _, w := range ws {
			t.Run(o.dir+"/"+w.Binary, func(t *testing.T) {
				env := []string{"HOME=" + t.TempDir(), "PATH=" + os.Getenv("PATH")}
				secrets := secretMounts(t, w)
				for k, v := range w.Env {
					if strings.HasPrefix(k, "BATON_") {
						env = append(env, k+"="+secrets.Replace(v))
					}
				}
				args := append(slices.Clone(w.Container.Args),
					"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--model", missing)
				cmd := exec.Command(filepath.Join(dir, w.Binary), args...)
				cmd.Env = env
				var stderr bytes.Buffer
				cmd.Stderr, cmd.Stdout = &stderr, &stderr
				done := make(chan error, 1)
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				go func() { done <- cmd.Wait() }()
				select {
				case <-done:
				case <-time.After(30 * time.Second):
					_ = cmd.Process.Kill()
					<-done
					t.Fatalf("%s did not exit: it should stop at the missing model\n%s", w.Binary, stderr.String())
				}
				msg := strings.TrimSpace(stderr.String())
				if code := cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(msg, "--model") || !strings.Contains(msg, missing) {
					t.Errorf("%s with the manifests' configuration: exit %d, %q; want exit 1 at the missing --model (anything earlier is a configuration error)", w.Binary, code, msg)
				}
			})
		}
	}
}

// devSecrets holds `batonctl certs` output arranged as the Secrets
// baton-tls-<role> hold it (tls.crt, tls.key, ca.crt), one directory per
// Secret, written once per test binary.
var devSecrets struct {
	once sync.Once
	dir  string
	err  error
}

// secretMounts maps each Secret volume mount of w's container to a
// directory holding what that Secret would: for the baton-tls-<role>
// Secrets, a development certificate of that role. Paths under other
// Secrets' mounts are left alone.
func secretMounts(t *testing.T, w manifest.Workload) *strings.Replacer {
	t.Helper()
	devSecrets.once.Do(func() {
		dir, err := os.MkdirTemp("", "baton-deploy-secrets-")
		if err != nil {
			devSecrets.err = err
			return
		}
		devSecrets.dir = dir
		cmd := exec.Command("go", "run", "./cmd/batonctl", "certs", "--out", filepath.Join(dir, "certs"))
		cmd.Dir = refdata.RepoRoot(t)
		if out, err := cmd.CombinedOutput(); err != nil {
			devSecrets.err = fmt.Errorf("batonctl certs: %v\n%s", err, out)
			return
		}
		for _, role := range []string{"router", "prefill", "decode"} {
			sd := filepath.Join(dir, "baton-tls-"+role)
			if devSecrets.err = os.Mkdir(sd, 0o700); devSecrets.err != nil {
				return
			}
			for dst, src := range map[string]string{"tls.crt": role + ".crt", "tls.key": role + ".key", "ca.crt": "ca.crt"} {
				if devSecrets.err = os.Symlink(filepath.Join(dir, "certs", src), filepath.Join(sd, dst)); devSecrets.err != nil {
					return
				}
			}
		}
	})
	if devSecrets.err != nil {
		t.Fatal(devSecrets.err)
	}
	secrets := map[string]string{}
	for _, v := range w.Deployment.Spec.Template.Spec.Volumes {
		if v.Secret != nil {
			secrets[v.Name] = v.Secret.SecretName
		}
	}
	var pairs []string
	for _, m := range w.Container.VolumeMounts {
		if name, ok := secrets[m.Name]; ok && strings.HasPrefix(name, "baton-tls-") {
			pairs = append(pairs, strings.TrimSuffix(m.MountPath, "/")+"/", filepath.Join(devSecrets.dir, name)+"/")
		}
	}
	return strings.NewReplacer(pairs...)
}

// TestCheckCatchesMistakes breaks the small overlay one way at a time and
// expects Check to say so: the checks above can fail.
func TestCheckCatchesMistakes(t *testing.T) {
	cfg := checkConfig(t)
	good := render(t, "k8s/overlays/small")
	if errs := manifest.Check(good, cfg); len(errs) > 0 {
		t.Fatalf("the small overlay does not pass as it is: %v", errs)
	}
	type bundle = manifest.Bundle
	cases := []struct {
		name   string
		mutate func(t *testing.T, b bundle)
		want   string
	}{
		{"readiness probe on the wrong port", func(t *testing.T, b bundle) {
			container(t, b, "router").ReadinessProbe.GRPC.Port = 8085
		}, "readiness probe checks gRPC port 8085 but the service listens on 8081"},
		{"worker readiness probed over gRPC, which takes only mutual TLS", func(t *testing.T, b bundle) {
			c := container(t, b, "decode")
			c.ReadinessProbe.HTTPGet = nil
			c.ReadinessProbe.GRPC = &corev1.GRPCAction{Port: 8084}
		}, "readiness probe must be an HTTP GET of /health/ready"},
		{"worker readiness on the gRPC port", func(t *testing.T, b bundle) {
			container(t, b, "prefill").ReadinessProbe.HTTPGet.Port = intstr.FromString("grpc")
		}, "readiness probe port grpc is not the HTTP listen port 8083"},
		{"mutual TLS off", func(t *testing.T, b bundle) {
			c := container(t, b, "decode")
			c.Env = slices.DeleteFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "BATON_TLS_KEY" })
		}, "--tls-key is not set: mutual TLS between router, prefill and decode is off"},
		{"another role's certificate", func(t *testing.T, b bundle) {
			for i, v := range deployment(t, b, "decode").Spec.Template.Spec.Volumes {
				if v.Secret != nil {
					deployment(t, b, "decode").Spec.Template.Spec.Volumes[i].Secret.SecretName = "baton-tls-prefill"
				}
			}
		}, "comes from Secret baton-tls-prefill, want baton-tls-decode"},
		{"key on a writable mount", func(t *testing.T, b bundle) {
			c := container(t, b, "router")
			for i := range c.VolumeMounts {
				if c.VolumeMounts[i].Name == "tls" {
					c.VolumeMounts[i].ReadOnly = false
				}
			}
		}, "on mount \"tls\", which must be read-only"},
		{"liveness probe on a path that is not /health", func(t *testing.T, b bundle) {
			container(t, b, "prefill").LivenessProbe.HTTPGet.Path = "/healthz"
		}, "liveness probe must be an HTTP GET of /health"},
		{"misspelt flag variable", func(t *testing.T, b bundle) {
			cm := configMap(t, b, "baton-decode")
			cm.Data["BATON_KV_CACHE_BYTE"] = cm.Data["BATON_KV_CACHE_BYTES"]
		}, "BATON_KV_CACHE_BYTE (from ConfigMap baton-decode) is not a flag of decode-svc"},
		{"worker flag given to the router", func(t *testing.T, b bundle) {
			configMap(t, b, "baton-router").Data["BATON_KV_DTYPE"] = "f16"
		}, "BATON_KV_DTYPE (from ConfigMap baton-router) is not a flag of router-svc"},
		{"malformed duration", func(t *testing.T, b bundle) {
			configMap(t, b, "baton-prefill").Data["BATON_HANDSHAKE_TIMEOUT"] = "5 seconds"
		}, "not a valid duration for --handshake-timeout"},
		{"unknown container arg", func(t *testing.T, b bundle) {
			container(t, b, "router").Args = []string{"--prefill-workers=2"}
		}, "no flag --prefill-workers"},
		{"listening on loopback", func(t *testing.T, b bundle) {
			configMap(t, b, "baton-prefill").Data["BATON_GRPC_ADDR"] = "127.0.0.1:8082"
		}, "is loopback"},
		{"container port renumbered", func(t *testing.T, b bundle) {
			container(t, b, "decode").Ports[0].ContainerPort = 9000
		}, "container port \"grpc\" is 9000 but --grpc-addr listens on 8084"},
		{"Service selector matching nothing", func(t *testing.T, b bundle) {
			service(t, b, "baton-decode").Spec.Selector["app.kubernetes.io/component"] = "decoder"
		}, "picks the pods of 0 Deployments"},
		{"worker Service with a cluster IP", func(t *testing.T, b bundle) {
			service(t, b, "baton-prefill").Spec.ClusterIP = ""
		}, "must be headless"},
		{"discovery in another namespace", func(t *testing.T, b bundle) {
			configMap(t, b, "baton-router").Data["BATON_DECODE"] = "dns:///baton-decode.default.svc.cluster.local:8084"
		}, "no Service baton-decode in namespace default"},
		{"discovery on the metrics port", func(t *testing.T, b bundle) {
			configMap(t, b, "baton-router").Data["BATON_PREFILL"] = "dns:///baton-prefill.baton.svc.cluster.local:8083"
		}, "reaches container port 8083 but prefill-svc listens for gRPC on 8082"},
		{"discovery pointing prefill at decode", func(t *testing.T, b bundle) {
			configMap(t, b, "baton-router").Data["BATON_PREFILL"] = "dns:///baton-decode.baton.svc.cluster.local:8084"
		}, "selects decode pods, not prefill"},
		{"static pod address", func(t *testing.T, b bundle) {
			configMap(t, b, "baton-router").Data["BATON_DECODE"] = "10.0.0.7:8084"
		}, "name the workers' headless Service as dns:///"},
		{"grace period shorter than the drain", func(t *testing.T, b bundle) {
			g := int64(60)
			deployment(t, b, "decode").Spec.Template.Spec.TerminationGracePeriodSeconds = &g
		}, "terminationGracePeriodSeconds 60 must exceed preStop 5s + --shutdown-timeout 1m0s"},
		{"drain longer than the grace period", func(t *testing.T, b bundle) {
			configMap(t, b, "baton-router").Data["BATON_SHUTDOWN_TIMEOUT"] = "2m"
		}, "must exceed preStop 5s + --shutdown-timeout 2m0s"},
		{"KV cache larger than the memory limit", func(t *testing.T, b bundle) {
			configMap(t, b, "baton-decode").Data["BATON_KV_CACHE_BYTES"] = "2GiB"
		}, "memory limit 2Gi is below --kv-cache-bytes 2GiB"},
		{"more threads than CPUs", func(t *testing.T, b bundle) {
			configMap(t, b, "baton-prefill").Data["BATON_THREADS"] = "8"
		}, "--threads 8 (env BATON_THREADS) exceeds the CPU limit 2"},
		{"KV layouts that prefill and decode do not share", func(t *testing.T, b bundle) {
			configMap(t, b, "baton-decode").Data["BATON_PAGE_SIZE"] = "32"
		}, "--page-size differs between services"},
		{"image of another service", func(t *testing.T, b bundle) {
			container(t, b, "prefill").Image = "baton/decode-svc:dev"
		}, "is not a prefill-svc image"},
		{"model cache on the read-only root", func(t *testing.T, b bundle) {
			configMap(t, b, "baton-model").Data["BATON_CACHE_DIR"] = "/home/nonroot/.cache"
		}, "BATON_CACHE_DIR /home/nonroot/.cache is on no volume mount"},
		{"OTLP endpoint naming no Service", func(t *testing.T, b bundle) {
			configMap(t, b, "baton-otel").Data["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://jaeger.baton.svc.cluster.local:4317"
		}, "no Service jaeger in namespace baton"},
		{"service links left on", func(t *testing.T, b bundle) {
			on := true
			deployment(t, b, "router").Spec.Template.Spec.EnableServiceLinks = &on
		}, "enableServiceLinks must be false"},
		{"preStop hook needing a shell", func(t *testing.T, b bundle) {
			c := container(t, b, "decode")
			c.Lifecycle.PreStop.Sleep = nil
			c.Lifecycle.PreStop.Exec = &corev1ExecAction{Command: []string{"sh", "-c", "sleep 5"}}
		}, "preStop exec cannot run"},
		{"test hooks deployed", func(t *testing.T, b bundle) {
			configMap(t, b, "baton-decode").Data["BATON_DEBUG_HOOKS"] = "true"
		}, "--debug-hooks is on (env BATON_DEBUG_HOOKS)"},
		{"envFrom a missing ConfigMap", func(t *testing.T, b bundle) {
			container(t, b, "router").EnvFrom[0].ConfigMapRef.Name = "baton-models"
		}, "envFrom ConfigMap \"baton-models\" does not exist"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := clone(good)
			tc.mutate(t, b)
			errs := manifest.Check(b, cfg)
			for _, err := range errs {
				if strings.Contains(err.Error(), tc.want) {
					return
				}
			}
			t.Errorf("Check did not report %q; it said %v", tc.want, errs)
		})
	}
}

// clone deep-copies a rendered bundle so that a case can break it.
func clone(b manifest.Bundle) manifest.Bundle {
	out := manifest.Bundle{Objects: slices.Clone(b.Objects)}
	for i := range out.Objects {
		out.Objects[i].Obj = b.Objects[i].Obj.(runtime.Object).DeepCopyObject()
	}
	return out
}

// TestDockerfile checks the image definitions without a Docker daemon: a
// static build, and final images with the one binary, an unprivileged user,
// no shell, exec-form entrypoints and the ports the manifests use.
func TestDockerfile(t *testing.T) {
	df := parseDockerfile(t)
	build, ok := df.Stage("build")
	if !ok {
		t.Fatal("no build stage")
	}
	env, err := build.Env()
	if err != nil {
		t.Fatal(err)
	}
	if env["CGO_ENABLED"] != "0" {
		t.Errorf("build stage: CGO_ENABLED=%q, want 0 (static binaries for a shell-less image)", env["CGO_ENABLED"])
	}
	runs := build.Find("RUN")
	if len(runs) != 1 {
		t.Fatalf("build stage has %d RUN instructions, want the one go build", len(runs))
	}
	ports := manifestPorts(t)
	for comp, bin := range manifest.Binaries {
		t.Run(comp, func(t *testing.T) {
			if !strings.Contains(runs[0].Args, "./"+bin) {
				t.Errorf("the build stage does not build ./%s", bin)
			}
			st, ok := df.Stage(comp)
			if !ok {
				t.Fatalf("no %q target", comp)
			}
			checkFinalStage(t, st, bin)
			expose := strings.Fields(strings.Join(instrArgs(st.Find("EXPOSE")), " "))
			var want []string
			for _, p := range ports[comp] {
				want = append(want, fmt.Sprint(p))
			}
			slices.Sort(expose)
			slices.Sort(want)
			if !slices.Equal(expose, want) {
				t.Errorf("EXPOSE %v, but the manifests' container ports are %v", expose, want)
			}
			env, err := st.Env()
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range []string{"BATON_GRPC_ADDR", "BATON_HTTP_ADDR"} {
				p, err := manifest.ListenPort(env[v])
				if err != nil || !slices.Contains(ports[comp], p) {
					t.Errorf("ENV %s=%q: want all interfaces on one of the ports %v (%v)", v, env[v], ports[comp], err)
				}
			}
		})
	}
	if st, ok := df.Stage("batonctl"); !ok {
		t.Error("no batonctl target")
	} else {
		checkFinalStage(t, st, "batonctl")
	}
}

func checkFinalStage(t *testing.T, st *dockerfile.Stage, bin string) {
	t.Helper()
	if !strings.HasPrefix(st.Base, "gcr.io/distroless/static") || !strings.HasSuffix(st.Base, ":nonroot") {
		t.Errorf("FROM %s: want gcr.io/distroless/static…:nonroot (no shell, CA certificates, user 65532)", st.Base)
	}
	for _, in := range st.Instructions {
		switch in.Cmd {
		case "RUN", "SHELL", "CMD", "ADD":
			t.Errorf("line %d: %s in a final image (it has no shell; copy what it needs from the build stage)", in.Line, in.Cmd)
		}
	}
	users := st.Find("USER")
	if len(users) == 0 {
		t.Error("no USER: the image would run as whatever the base says")
	} else if u, _, _ := strings.Cut(users[len(users)-1].Args, ":"); u == "0" || u == "root" {
		t.Errorf("USER %s: must not be root", users[len(users)-1].Args)
	}
	eps := st.Find("ENTRYPOINT")
	if len(eps) != 1 {
		t.Fatalf("%d ENTRYPOINTs, want 1", len(eps))
	}
	argv, err := dockerfile.ExecForm(eps[0])
	if err != nil {
		t.Fatal(err)
	}
	if len(argv) != 1 || filepath.Base(argv[0]) != bin {
		t.Errorf("ENTRYPOINT %q: want [\"/…/%s\"] with flags from the environment or the pod's args", argv, bin)
	}
	copied := false
	for _, in := range st.Find("COPY") {
		f := strings.Fields(in.Args)
		copied = copied || (len(f) == 3 && f[0] == "--from=build" && filepath.Base(f[1]) == bin && f[2] == argv[0])
	}
	if !copied {
		t.Errorf("no COPY --from=build of %s to %s", bin, argv[0])
	}
}

func instrArgs(ins []dockerfile.Instruction) []string {
	var out []string
	for _, in := range ins {
		out = append(out, in.Args)
	}
	return out
}

// manifestPorts returns each component's container ports in the base.
func manifestPorts(t *testing.T) map[string][]int32 {
	t.Helper()
	out := map[string][]int32{}
	for _, d := range render(t, "k8s/base").Deployments() {
		comp := d.Spec.Template.Labels[manifest.LabelComponent]
		for _, c := range d.Spec.Template.Spec.Containers {
			if c.Name == comp {
				for _, p := range c.Ports {
					out[comp] = append(out[comp], p.ContainerPort)
				}
			}
		}
	}
	return out
}

// TestBinariesAreStatic checks that the build the Dockerfile runs yields
// binaries that need no dynamic loader or C library: the distroless/static
// base has neither.
func TestBinariesAreStatic(t *testing.T) {
	if goruntime.GOOS != "linux" {
		t.Skip("reads the binaries as ELF files")
	}
	dir, _ := binaries(t)
	for _, bin := range manifest.Binaries {
		f, err := elf.Open(filepath.Join(dir, bin))
		if err != nil {
			t.Fatalf("%s: %v", bin, err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s asks for a dynamic loader", bin)
			}
		}
		if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
			t.Errorf("%s links shared libraries %v (%v)", bin, libs, err)
		}
		f.Close()
	}
}
