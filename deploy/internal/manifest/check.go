package manifest

import (
	"fmt"
	"math"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TraceFlush is how long a service may spend flushing traces after its drain
// (svckit.Main gives tracing's Shutdown 5 s); the pod's grace period must
// cover it.
const TraceFlush = 5 * time.Second

// KVHeadroom is the memory a worker needs beyond its KV cache at the least
// (Go runtime, buffers, a small model); the model file comes on top.
var KVHeadroom = resource.MustParse("256Mi")

// Config is what Check compares the manifests with.
type Config struct {
	// Flags holds each binary's flags by binary name ("router-svc").
	Flags map[string]FlagSet
	// LibraryEnv lists BATON_* variables that the binaries read although
	// they are not flags (the model cache directory, the hub's address).
	LibraryEnv []string
}

// Check returns every disagreement between the bundle and the binaries, and
// every inconsistency inside the bundle; none means it would deploy and wire
// up as intended.
func Check(b Bundle, cfg Config) []error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	nss := b.namespaces()
	switch {
	case len(nss) != 1 || nss[0] == "":
		add("objects are spread over namespaces %q; want them all in one, set by the kustomization", nss)
	default:
		found := false
		for _, o := range b.Objects {
			found = found || (o.Kind == "Namespace" && o.Name == nss[0])
		}
		if !found {
			add("no Namespace object %q", nss[0])
		}
	}
	errs = append(errs, checkLabels(b)...)

	ws, werrs := b.Workloads()
	errs = append(errs, werrs...)
	for _, comp := range []string{"router", "prefill", "decode"} {
		if !slices.ContainsFunc(ws, func(w Workload) bool { return w.Component == comp }) {
			add("no Deployment runs the %s (pod label %s=%s)", Binaries[comp], LabelComponent, comp)
		}
	}
	ports := map[*Workload]listenPorts{}
	for i := range ws {
		w := &ws[i]
		flags, ok := cfg.Flags[w.Binary]
		if !ok {
			add("%s: no flags known for %s", w, w.Binary)
			continue
		}
		p, perrs := checkWorkload(w, flags, cfg)
		errs = append(errs, perrs...)
		ports[w] = p
	}
	errs = append(errs, checkServices(b, ws, ports)...)
	errs = append(errs, checkPDBs(b)...)
	errs = append(errs, checkDiscovery(b, ws, ports, cfg)...)
	errs = append(errs, checkAgreement(ws, cfg)...)
	errs = append(errs, checkOTLP(b, ws)...)
	return errs
}

type listenPorts struct{ grpc, http int32 }

func checkLabels(b Bundle) []error {
	var errs []error
	for _, o := range b.Objects {
		var labels map[string]string
		switch obj := o.Obj.(type) {
		case *appsv1.Deployment:
			labels = obj.Labels
			tl := obj.Spec.Template.Labels
			if obj.Spec.Selector == nil || len(obj.Spec.Selector.MatchExpressions) > 0 {
				errs = append(errs, fmt.Errorf("%s: the selector must be matchLabels only", o))
			} else if !selects(obj.Spec.Selector.MatchLabels, tl) || obj.Spec.Selector.MatchLabels[LabelComponent] == "" {
				errs = append(errs, fmt.Errorf("%s: selector %v must include %s and match the pod labels %v", o, obj.Spec.Selector.MatchLabels, LabelComponent, tl))
			}
			if tl[LabelName] != AppName || tl[LabelComponent] != labels[LabelComponent] {
				errs = append(errs, fmt.Errorf("%s: pod labels %v disagree with the Deployment's %v on %s/%s", o, tl, labels, LabelName, LabelComponent))
			}
		case *corev1.Service:
			labels = obj.Labels
		case *policyv1.PodDisruptionBudget:
			labels = obj.Labels
		default:
			continue
		}
		if labels[LabelName] != AppName || labels[LabelComponent] == "" {
			errs = append(errs, fmt.Errorf("%s: labels %v: want %s=%s and a %s", o, labels, LabelName, AppName, LabelComponent))
		}
	}
	return errs
}

func checkWorkload(w *Workload, flags FlagSet, cfg Config) (listenPorts, []error) {
	var errs []error
	add := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", w, fmt.Sprintf(format, args...)))
	}
	c, pod := w.Container, &w.Deployment.Spec.Template.Spec

	if got := imageName(c.Image); got != w.Binary {
		add("image %q is not a %s image (its last path element should be %s)", c.Image, w.Binary, w.Binary)
	}
	if len(c.Command) > 0 {
		add("command %q replaces the image's entrypoint; pass flags in args or the ConfigMap instead", c.Command)
	}
	if _, err := ParseArgs(flags, c.Args); err != nil {
		add("args: %v", err)
	}
	names := make([]string, 0, len(w.EnvSource))
	for n := range w.EnvSource {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if !strings.HasPrefix(n, "BATON_") {
			continue
		}
		f, ok := flags.ByEnv(n)
		if !ok {
			if !slices.Contains(cfg.LibraryEnv, n) {
				add("%s (from %s) is not a flag of %s, so it would be ignored", n, w.EnvSource[n], w.Binary)
			}
			continue
		}
		if v, ok := w.Env[n]; ok {
			if err := checkValue(f, v); err != nil {
				add("%s=%q (from %s): %v", n, v, w.EnvSource[n], err)
			}
		}
	}

	// Listen addresses, container ports and probes must all name the same ports.
	var lp listenPorts
	for _, l := range []struct {
		flag, port string
		dst        *int32
	}{{"grpc-addr", "grpc", &lp.grpc}, {"http-addr", "http", &lp.http}} {
		s, err := w.Effective(flags, l.flag)
		if err != nil {
			add("%v", err)
			continue
		}
		p, err := ListenPort(s.Value)
		if err != nil {
			add("--%s (%s): %v", l.flag, s.From, err)
			continue
		}
		*l.dst = p
		cp, ok := containerPort(pod, l.port, 0)
		switch {
		case !ok:
			add("no container port named %q (the service listens on %d)", l.port, p)
		case cp != p:
			add("container port %q is %d but --%s listens on %d", l.port, cp, l.flag, p)
		}
	}
	checkHTTPProbe := func(kind string, pr *corev1.Probe) {
		if pr.HTTPGet == nil || pr.HTTPGet.Path != "/health" {
			add("%s probe must be an HTTP GET of /health (shallow liveness)", kind)
			return
		}
		if got, ok := probePort(pod, pr.HTTPGet.Port); !ok || got != lp.http {
			add("%s probe port %s is not the HTTP listen port %d", kind, pr.HTTPGet.Port.String(), lp.http)
		}
	}
	worker := w.Binary != "router-svc"
	switch rp := c.ReadinessProbe; {
	case worker && (rp == nil || rp.HTTPGet == nil || rp.HTTPGet.Path != "/health/ready"):
		// A worker's gRPC port takes only mutual TLS; the kubelet's gRPC
		// probe has no client certificate.
		add("readiness probe must be an HTTP GET of /health/ready (the gRPC port takes only mutual TLS, which the kubelet's gRPC probe cannot do)")
	case worker:
		if got, ok := probePort(pod, rp.HTTPGet.Port); !ok || got != lp.http {
			add("readiness probe port %s is not the HTTP listen port %d", rp.HTTPGet.Port.String(), lp.http)
		}
	case rp == nil || rp.GRPC == nil:
		add("readiness probe must be a gRPC health check (earned readiness is reported there)")
	case rp.GRPC.Port != lp.grpc:
		add("readiness probe checks gRPC port %d but the service listens on %d", rp.GRPC.Port, lp.grpc)
	case rp.GRPC.Service != nil && *rp.GRPC.Service != "":
		add("readiness probe asks for service %q; the overall status (\"\") is the one that includes every readiness check", *rp.GRPC.Service)
	}
	if c.LivenessProbe == nil {
		add("no liveness probe")
	} else {
		checkHTTPProbe("liveness", c.LivenessProbe)
	}
	if c.StartupProbe == nil {
		add("no startup probe: downloading and loading the model takes longer than liveness allows")
	} else {
		checkHTTPProbe("startup", c.StartupProbe)
	}

	// Drain: the kubelet's SIGKILL must come after the preStop sleep, the
	// service's own drain and the trace flush.
	var sleep time.Duration
	if l := c.Lifecycle; l != nil && l.PreStop != nil {
		switch {
		case l.PreStop.Exec != nil:
			add("preStop exec cannot run: the images have no shell or tools")
		case l.PreStop.Sleep != nil:
			sleep = time.Duration(l.PreStop.Sleep.Seconds) * time.Second
		}
	}
	if s, err := w.Effective(flags, "shutdown-timeout"); err != nil {
		add("%v", err)
	} else if d, err := time.ParseDuration(s.Value); err != nil {
		add("--shutdown-timeout %q (%s): %v", s.Value, s.From, err)
	} else {
		grace := 30 * time.Second // the API's default
		if g := pod.TerminationGracePeriodSeconds; g != nil {
			grace = time.Duration(*g) * time.Second
		}
		if need := sleep + d + TraceFlush; grace <= need {
			add("terminationGracePeriodSeconds %v must exceed preStop %v + --shutdown-timeout %v (%s) + trace flush %v = %v",
				grace.Seconds(), sleep, d, s.From, TraceFlush, need)
		}
	}

	errs = append(errs, checkResources(w, flags)...)
	errs = append(errs, checkTLS(w, flags)...)

	// Test hooks let anyone who reaches the HTTP port stall the scheduler.
	if _, ok := flags["debug-hooks"]; ok {
		if s, err := w.Effective(flags, "debug-hooks"); err == nil {
			if on, _ := strconv.ParseBool(s.Value); on {
				add("--debug-hooks is on (%s): chaos-test hooks must never be deployed", s.From)
			}
		}
	}

	// Hardening the images allow: they run as an unprivileged user with no
	// shell, and write only to volumes.
	runAsNonRoot := pod.SecurityContext != nil && pod.SecurityContext.RunAsNonRoot != nil && *pod.SecurityContext.RunAsNonRoot
	sc := c.SecurityContext
	if sc != nil && sc.RunAsNonRoot != nil {
		runAsNonRoot = *sc.RunAsNonRoot
	}
	if !runAsNonRoot {
		add("runAsNonRoot must be true")
	}
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		add("allowPrivilegeEscalation must be false")
	}
	readOnlyRoot := sc != nil && sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem
	if !readOnlyRoot {
		add("readOnlyRootFilesystem must be true")
	}
	if pod.EnableServiceLinks == nil || *pod.EnableServiceLinks {
		add("enableServiceLinks must be false: service-link variables (BATON_..._PORT) share the flags' BATON_ prefix")
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		add("automountServiceAccountToken must be false: the services never call the Kubernetes API")
	}

	// The model: a path on a volume, or hf:// downloaded into a writable cache.
	vols := map[string]bool{}
	for _, v := range pod.Volumes {
		vols[v.Name] = true
	}
	for _, m := range c.VolumeMounts {
		if !vols[m.Name] {
			add("volume mount %q names no volume of the pod", m.Name)
		}
	}
	if s, err := w.Effective(flags, "model"); err != nil {
		add("%v", err)
	} else if s.Value == "" {
		add("no model: set BATON_MODEL (the images hold none)")
	} else if strings.HasPrefix(s.Value, "hf://") {
		dir, ok := w.Env["BATON_CACHE_DIR"]
		switch m, mounted := mountFor(c, dir); {
		case !ok:
			add("model %s is downloaded, but BATON_CACHE_DIR is not set (the default is in the read-only root)", s.Value)
		case !mounted:
			add("BATON_CACHE_DIR %s is on no volume mount", dir)
		case m.ReadOnly:
			add("BATON_CACHE_DIR %s is on read-only mount %q", dir, m.Name)
		}
	} else if _, mounted := mountFor(c, s.Value); !mounted {
		add("model path %s is on no volume mount", s.Value)
	}

	ann := w.Deployment.Spec.Template.Annotations
	if p, ok := ann["prometheus.io/port"]; ok && p != strconv.Itoa(int(lp.http)) {
		add("annotation prometheus.io/port %q is not the HTTP port %d that serves /metrics", p, lp.http)
	}
	if p, ok := ann["prometheus.io/path"]; ok && p != "/metrics" {
		add("annotation prometheus.io/path %q: metrics are at /metrics", p)
	}
	return lp, errs
}

// checkTLS: every service has mutual TLS on, with its own role's
// certificate, key and CA read from a read-only mount of the Secret
// baton-tls-<role> (the Secret's certificate names the role; a pod mounting
// another role's Secret would be refused by its peers or fail to start).
func checkTLS(w *Workload, flags FlagSet) []error {
	var errs []error
	add := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", w, fmt.Sprintf(format, args...)))
	}
	role := strings.TrimSuffix(w.Binary, "-svc")
	want := "baton-tls-" + role
	secrets := map[string]string{} // volume name -> Secret name
	for _, v := range w.Deployment.Spec.Template.Spec.Volumes {
		if v.Secret != nil {
			secrets[v.Name] = v.Secret.SecretName
		}
	}
	for _, f := range []string{"tls-cert", "tls-key", "tls-ca"} {
		if _, ok := flags[f]; !ok {
			add("%s has no --%s flag", w.Binary, f)
			continue
		}
		s, err := w.Effective(flags, f)
		if err != nil {
			add("%v", err)
			continue
		}
		if s.Value == "" {
			add("--%s is not set: mutual TLS between router, prefill and decode is off (set BATON_TLS_CERT, BATON_TLS_KEY and BATON_TLS_CA to files of the Secret %s)", f, want)
			continue
		}
		m, ok := mountFor(w.Container, s.Value)
		switch {
		case !ok:
			add("--%s %s (%s) is on no volume mount", f, s.Value, s.From)
		case !m.ReadOnly:
			add("--%s %s is on mount %q, which must be read-only", f, s.Value, m.Name)
		case secrets[m.Name] == "":
			add("--%s %s is on volume %q, which is not a Secret", f, s.Value, m.Name)
		case secrets[m.Name] != want:
			add("--%s %s comes from Secret %s, want %s (its certificate must name the role %s)", f, s.Value, secrets[m.Name], want, role)
		}
	}
	return errs
}

func checkResources(w *Workload, flags FlagSet) []error {
	var errs []error
	add := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", w, fmt.Sprintf(format, args...)))
	}
	r := w.Container.Resources
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, okReq := r.Requests[name]
		lim, okLim := r.Limits[name]
		if !okReq || !okLim {
			add("resources: %s needs both a request and a limit", name)
			continue
		}
		if req.Cmp(lim) > 0 {
			add("resources: %s request %s exceeds its limit %s", name, req.String(), lim.String())
		}
	}
	if _, ok := flags["kv-cache-bytes"]; ok {
		if s, err := w.Effective(flags, "kv-cache-bytes"); err == nil {
			kv, err := ParseByteSize(s.Value)
			lim, okLim := r.Limits[corev1.ResourceMemory]
			switch {
			case err != nil:
				add("--kv-cache-bytes %q (%s): %v", s.Value, s.From, err)
			case okLim:
				need := resource.NewQuantity(kv, resource.BinarySI)
				need.Add(KVHeadroom)
				if lim.Cmp(*need) < 0 {
					add("memory limit %s is below --kv-cache-bytes %s (%s) + %s: the KV cache alone would get the pod OOM-killed",
						lim.String(), s.Value, s.From, KVHeadroom.String())
				}
			}
		}
	}
	if _, ok := flags["threads"]; ok {
		if s, err := w.Effective(flags, "threads"); err == nil {
			n, err := strconv.Atoi(s.Value)
			lim, okLim := r.Limits[corev1.ResourceCPU]
			if err == nil && n > 0 && okLim {
				if cpus := int(math.Ceil(float64(lim.MilliValue()) / 1000)); n > cpus {
					add("--threads %d (%s) exceeds the CPU limit %s: the forward pass would be throttled", n, s.From, lim.String())
				}
			}
		}
	}
	return errs
}

// checkValue checks a flag value by the flag's type, as flag.Parse would.
func checkValue(f Flag, v string) error {
	var err error
	switch f.Type {
	case "int":
		_, err = strconv.ParseInt(v, 0, 64)
	case "uint":
		_, err = strconv.ParseUint(v, 0, 64)
	case "float":
		_, err = strconv.ParseFloat(v, 64)
	case "bool":
		_, err = strconv.ParseBool(v)
	case "duration":
		_, err = time.ParseDuration(v)
	}
	if err != nil {
		return fmt.Errorf("not a valid %s for --%s", f.Type, f.Name)
	}
	return nil
}

// imageName returns the last path element of an image reference, without
// tag or digest: "registry:5000/baton/router-svc:v1" is "router-svc".
func imageName(ref string) string {
	ref, _, _ = strings.Cut(ref, "@")
	if i := strings.LastIndex(ref, "/"); i >= 0 {
		ref = ref[i+1:]
	}
	name, _, _ := strings.Cut(ref, ":")
	return name
}

func probePort(pod *corev1.PodSpec, p intstr.IntOrString) (int32, bool) {
	if p.Type == intstr.String {
		return containerPort(pod, p.StrVal, 0)
	}
	return containerPort(pod, "", p.IntVal)
}

// mountFor returns the volume mount that holds path.
func mountFor(c *corev1.Container, path string) (corev1.VolumeMount, bool) {
	if path == "" {
		return corev1.VolumeMount{}, false
	}
	for _, m := range c.VolumeMounts {
		mp := strings.TrimSuffix(m.MountPath, "/")
		if path == mp || strings.HasPrefix(path, mp+"/") {
			return m, true
		}
	}
	return corev1.VolumeMount{}, false
}

func checkServices(b Bundle, ws []Workload, ports map[*Workload]listenPorts) []error {
	var errs []error
	for _, s := range b.Services() {
		src := b.source(s)
		add := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("Service %s (%s): %s", s.Name, src, fmt.Sprintf(format, args...)))
		}
		ds := b.selected(s.Namespace, s.Spec.Selector)
		if len(ds) != 1 {
			add("selector %v picks the pods of %d Deployments, want exactly 1", s.Spec.Selector, len(ds))
			continue
		}
		d := ds[0]
		headless := s.Spec.ClusterIP == corev1.ClusterIPNone
		for _, p := range s.Spec.Ports {
			tp := p.TargetPort
			if tp.Type == intstr.Int && tp.IntVal == 0 {
				tp = intstr.FromInt32(p.Port)
			}
			cp, ok := probePort(&d.Spec.Template.Spec, tp)
			if !ok {
				add("port %q: targetPort %s is no container port of Deployment %s", p.Name, tp.String(), d.Name)
				continue
			}
			if headless && cp != p.Port {
				add("port %q: headless, so clients dial the pods on port %d, but the container port is %d", p.Name, p.Port, cp)
			}
		}
		comp := d.Spec.Template.Labels[LabelComponent]
		var w *Workload
		for i := range ws {
			if ws[i].Deployment == d {
				w = &ws[i]
			}
		}
		if w == nil {
			continue
		}
		switch {
		case comp == "router" && headless:
			add("the router's Service must have a cluster IP: clients are balanced over router replicas")
		case comp != "router" && !headless:
			add("a %s Service must be headless (clusterIP: None): the router discovers every pod by DNS", comp)
		}
		lp := ports[w]
		for _, want := range []struct {
			what string
			port int32
		}{{"gRPC", lp.grpc}, {"HTTP", lp.http}} {
			found := false
			for _, p := range s.Spec.Ports {
				if cp, ok := probePort(&d.Spec.Template.Spec, orPort(p)); ok && cp == want.port {
					found = true
				}
			}
			if !found && want.port != 0 {
				add("exposes no port reaching the %s %s port %d", comp, want.what, want.port)
			}
		}
	}
	return errs
}

func orPort(p corev1.ServicePort) intstr.IntOrString {
	if p.TargetPort.Type == intstr.Int && p.TargetPort.IntVal == 0 {
		return intstr.FromInt32(p.Port)
	}
	return p.TargetPort
}

func checkPDBs(b Bundle) []error {
	var errs []error
	for _, o := range b.Objects {
		pdb, ok := o.Obj.(*policyv1.PodDisruptionBudget)
		if !ok {
			continue
		}
		if pdb.Spec.Selector == nil || len(b.selected(pdb.Namespace, pdb.Spec.Selector.MatchLabels)) != 1 {
			errs = append(errs, fmt.Errorf("%s: selector must pick the pods of exactly one Deployment", o))
		}
		if pdb.Spec.MinAvailable != nil {
			// With one replica, minAvailable blocks every node drain.
			errs = append(errs, fmt.Errorf("%s: use maxUnavailable, not minAvailable (a 1-replica overlay could never be drained)", o))
		}
	}
	return errs
}

// checkDiscovery checks that the router's --prefill and --decode name, by
// dns:///NAME:PORT, headless Services of the bundle whose port reaches the
// workers' gRPC listen port.
func checkDiscovery(b Bundle, ws []Workload, ports map[*Workload]listenPorts, cfg Config) []error {
	var errs []error
	for i := range ws {
		r := &ws[i]
		if r.Component != "router" {
			continue
		}
		flags := cfg.Flags[r.Binary]
		for _, role := range []string{"prefill", "decode"} {
			add := func(format string, args ...any) {
				errs = append(errs, fmt.Errorf("%s: --%s: %s", r, role, fmt.Sprintf(format, args...)))
			}
			s, err := r.Effective(flags, role)
			if err != nil {
				add("%v", err)
				continue
			}
			if role == "prefill" && strings.TrimSpace(s.Value) == "local" {
				continue // colocated: decode computes prompts itself
			}
			for _, a := range strings.Split(s.Value, ",") {
				a = strings.TrimSpace(a)
				hostport, ok := strings.CutPrefix(a, "dns:///")
				if !ok {
					add("%q (%s): in Kubernetes name the workers' headless Service as dns:///NAME.NAMESPACE.svc.cluster.local:PORT; pod addresses change", a, s.From)
					continue
				}
				svc, port, err := serviceRef(hostport, r.Deployment.Namespace, true)
				if err != nil {
					add("%q: %v", a, err)
					continue
				}
				ep, err := resolveServicePort(b, svc, port)
				if err != nil {
					add("%q: %v", a, err)
					continue
				}
				if !ep.headless {
					add("%q: Service %s is not headless; DNS would return one virtual IP, not the workers", a, svc.name)
				}
				if ep.component != role {
					add("%q: Service %s selects %s pods, not %s", a, svc.name, ep.component, role)
					continue
				}
				for j := range ws {
					w := &ws[j]
					if w.Component == role && ports[w].grpc != 0 && ports[w].grpc != ep.port {
						add("%q reaches container port %d but %s listens for gRPC on %d", a, ep.port, w.Binary, ports[w].grpc)
					}
				}
			}
		}
	}
	return errs
}

type svcRef struct{ name, namespace string }

// serviceRef parses NAME.NAMESPACE.svc[.DOMAIN]:PORT; unless fqdnOnly, a
// bare NAME:PORT names a Service in namespace ns.
func serviceRef(hostport, ns string, fqdnOnly bool) (svcRef, int32, error) {
	host, portStr, ok := strings.Cut(hostport, ":")
	if !ok {
		return svcRef{}, 0, fmt.Errorf("no port")
	}
	port, err := strconv.ParseInt(portStr, 10, 32)
	if err != nil || port < 1 || port > 65535 {
		return svcRef{}, 0, fmt.Errorf("port %q is not a number in 1-65535", portStr)
	}
	parts := strings.Split(host, ".")
	switch {
	case len(parts) >= 3 && parts[2] == "svc":
		return svcRef{name: parts[0], namespace: parts[1]}, int32(port), nil
	case len(parts) == 1 && !fqdnOnly:
		return svcRef{name: parts[0], namespace: ns}, int32(port), nil
	}
	return svcRef{}, 0, fmt.Errorf("host %q is not a Service name NAME.NAMESPACE.svc.cluster.local", host)
}

// endpoint is where a Service port leads.
type endpoint struct {
	port      int32  // the container port
	component string // of the pods behind the Service
	headless  bool
}

// resolveServicePort finds the Service and its port, and where they lead.
func resolveServicePort(b Bundle, ref svcRef, port int32) (endpoint, error) {
	s, ok := b.Service(ref.namespace, ref.name)
	if !ok {
		return endpoint{}, fmt.Errorf("no Service %s in namespace %s", ref.name, ref.namespace)
	}
	var sp *corev1.ServicePort
	for i := range s.Spec.Ports {
		if s.Spec.Ports[i].Port == port {
			sp = &s.Spec.Ports[i]
		}
	}
	if sp == nil {
		return endpoint{}, fmt.Errorf("Service %s has no port %d", ref.name, port)
	}
	ds := b.selected(s.Namespace, s.Spec.Selector)
	if len(ds) != 1 {
		return endpoint{}, fmt.Errorf("Service %s selects %d Deployments", ref.name, len(ds))
	}
	cp, ok := probePort(&ds[0].Spec.Template.Spec, orPort(*sp))
	if !ok {
		return endpoint{}, fmt.Errorf("Service %s port %d reaches no container port", ref.name, port)
	}
	return endpoint{port: cp, component: ds[0].Spec.Template.Labels[LabelComponent],
		headless: s.Spec.ClusterIP == corev1.ClusterIPNone}, nil
}

// checkAgreement checks the settings that prefill and decode (and the
// router) must share: the KV layout is compared in every handshake, and the
// model and context window by the router before it routes to a worker.
func checkAgreement(ws []Workload, cfg Config) []error {
	var errs []error
	for _, flag := range []struct {
		name  string
		roles []string
	}{
		{"model", []string{"router", "prefill", "decode"}},
		{"context-length", []string{"router", "prefill", "decode"}},
		{"kv-dtype", []string{"prefill", "decode"}},
		{"page-size", []string{"prefill", "decode"}},
	} {
		values := map[string][]string{}
		for i := range ws {
			w := &ws[i]
			if !slices.Contains(flag.roles, w.Component) {
				continue
			}
			s, err := w.Effective(cfg.Flags[w.Binary], flag.name)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %v", w, err))
				continue
			}
			values[s.Value] = append(values[s.Value], w.Deployment.Name)
		}
		if len(values) > 1 {
			errs = append(errs, fmt.Errorf("--%s differs between services: %v", flag.name, values))
		}
	}
	return errs
}

// checkOTLP checks that an OTLP endpoint naming a Service of the bundle
// reaches a container port of the pods behind it.
func checkOTLP(b Bundle, ws []Workload) []error {
	var errs []error
	for i := range ws {
		w := &ws[i]
		for _, name := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
			v, ok := w.Env[name]
			if !ok {
				continue
			}
			u, err := url.Parse(v)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Port() == "" {
				errs = append(errs, fmt.Errorf("%s: %s=%q: want http://HOST:PORT (gRPC, plain text) or https://", w, name, v))
				continue
			}
			if !strings.Contains(u.Hostname(), ".svc") && strings.Contains(u.Hostname(), ".") {
				continue // a collector outside the cluster
			}
			ref, port, err := serviceRef(u.Host, w.Deployment.Namespace, false)
			if err == nil {
				_, err = resolveServicePort(b, ref, port)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %s=%q: %v", w, name, v, err))
			}
		}
	}
	return errs
}

// ParseByteSize parses the sizes --kv-cache-bytes accepts ("1073741824",
// "512MiB", "4GiB", "100MB").
func ParseByteSize(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   float64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}}
	num, mult := strings.TrimSpace(s), 1.0
	for _, u := range units {
		if n, ok := strings.CutSuffix(num, u.suffix); ok {
			num, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v <= 0 || math.IsInf(v, 0) || v*mult > 1<<50 {
		return 0, fmt.Errorf("size %q: want bytes or a number with KiB, MiB, GiB, TiB, KB, MB or GB", s)
	}
	return int64(v * mult), nil
}
