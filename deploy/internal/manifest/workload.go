package manifest

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// Labels every Baton object carries.
const (
	LabelName      = "app.kubernetes.io/name"
	LabelComponent = "app.kubernetes.io/component"
	AppName        = "baton"
)

// Binaries maps the app.kubernetes.io/component label of a Baton Deployment
// to the binary its main container runs. The container has the component's
// name.
var Binaries = map[string]string{
	"router":  "router-svc",
	"prefill": "prefill-svc",
	"decode":  "decode-svc",
}

// Workload is a Baton service's container as a pod would run it.
type Workload struct {
	Component  string
	Binary     string
	Deployment *appsv1.Deployment
	Container  *corev1.Container
	Source     string
	// Env is the container's environment with literal values: the keys of
	// its envFrom ConfigMaps, then its env entries (later wins, as in the
	// kubelet). Entries set from a field or a Secret are left out.
	Env map[string]string
	// EnvSource says where each Env entry came from, for messages.
	EnvSource map[string]string
}

// Bundle is the set of objects one `kubectl apply -k` creates.
type Bundle struct {
	Objects []Object
}

// Deployments returns the bundle's Deployments.
func (b Bundle) Deployments() []*appsv1.Deployment {
	var out []*appsv1.Deployment
	for _, o := range b.Objects {
		if d, ok := o.Obj.(*appsv1.Deployment); ok {
			out = append(out, d)
		}
	}
	return out
}

// Services returns the bundle's Services.
func (b Bundle) Services() []*corev1.Service {
	var out []*corev1.Service
	for _, o := range b.Objects {
		if s, ok := o.Obj.(*corev1.Service); ok {
			out = append(out, s)
		}
	}
	return out
}

// ConfigMap returns the named ConfigMap in namespace ns.
func (b Bundle) ConfigMap(ns, name string) (*corev1.ConfigMap, bool) {
	for _, o := range b.Objects {
		if c, ok := o.Obj.(*corev1.ConfigMap); ok && c.Name == name && c.Namespace == ns {
			return c, true
		}
	}
	return nil, false
}

// Service returns the named Service in namespace ns.
func (b Bundle) Service(ns, name string) (*corev1.Service, bool) {
	for _, s := range b.Services() {
		if s.Name == name && s.Namespace == ns {
			return s, true
		}
	}
	return nil, false
}

// Replicas returns the replica count of the Deployment whose pods carry the
// component label, and whether there is exactly one such Deployment.
func (b Bundle) Replicas(component string) (int32, bool) {
	var n int32
	found := 0
	for _, d := range b.Deployments() {
		if d.Spec.Template.Labels[LabelComponent] == component {
			found++
			n = 1
			if d.Spec.Replicas != nil {
				n = *d.Spec.Replicas
			}
		}
	}
	return n, found == 1
}

// source finds the Object a typed pointer came from.
func (b Bundle) source(obj any) string {
	for _, o := range b.Objects {
		if o.Obj == obj {
			return o.Source
		}
	}
	return "?"
}

// Workloads returns the Baton service containers of the bundle with their
// resolved environment. Errors name references that do not resolve.
func (b Bundle) Workloads() ([]Workload, []error) {
	var out []Workload
	var errs []error
	for _, d := range b.Deployments() {
		comp := d.Spec.Template.Labels[LabelComponent]
		bin, ok := Binaries[comp]
		if !ok {
			continue
		}
		src := b.source(d)
		var c *corev1.Container
		for i := range d.Spec.Template.Spec.Containers {
			if d.Spec.Template.Spec.Containers[i].Name == comp {
				c = &d.Spec.Template.Spec.Containers[i]
			}
		}
		if c == nil {
			errs = append(errs, fmt.Errorf("Deployment %s (%s): no container named %q", d.Name, src, comp))
			continue
		}
		w := Workload{Component: comp, Binary: bin, Deployment: d, Container: c, Source: src,
			Env: map[string]string{}, EnvSource: map[string]string{}}
		for _, ef := range c.EnvFrom {
			switch {
			case ef.ConfigMapRef != nil:
				cm, ok := b.ConfigMap(d.Namespace, ef.ConfigMapRef.Name)
				if !ok {
					if ef.ConfigMapRef.Optional == nil || !*ef.ConfigMapRef.Optional {
						errs = append(errs, fmt.Errorf("%s: envFrom ConfigMap %q does not exist in namespace %q", w, ef.ConfigMapRef.Name, d.Namespace))
					}
					continue
				}
				for k, v := range cm.Data {
					name := ef.Prefix + k
					if prev, dup := w.EnvSource[name]; dup {
						// The kubelet keeps the last, silently: a trap when
						// two ConfigMaps disagree.
						errs = append(errs, fmt.Errorf("%s: %s is set by both %s and ConfigMap %s", w, name, prev, cm.Name))
					}
					w.Env[name] = v
					w.EnvSource[name] = "ConfigMap " + cm.Name
				}
			case ef.SecretRef != nil:
				// Keys unknown here; Secrets hold credentials, not flags.
			}
		}
		for _, e := range c.Env {
			if e.ValueFrom != nil {
				delete(w.Env, e.Name)
				w.EnvSource[e.Name] = "env (valueFrom)"
				continue
			}
			w.Env[e.Name] = e.Value
			w.EnvSource[e.Name] = "env"
		}
		out = append(out, w)
	}
	return out, errs
}

func (w Workload) String() string {
	return fmt.Sprintf("Deployment %s container %s (%s)", w.Deployment.Name, w.Container.Name, w.Source)
}

// Setting is the effective value of one flag in a container: from its args,
// else its environment, else the binary's default.
type Setting struct {
	Value string
	From  string // "args", "env" or "default"
}

// Effective returns the value the binary will use for a flag.
func (w Workload) Effective(flags FlagSet, name string) (Setting, error) {
	f, ok := flags[name]
	if !ok {
		return Setting{}, fmt.Errorf("%s has no flag --%s", w.Binary, name)
	}
	args, err := ParseArgs(flags, w.Container.Args)
	if err != nil {
		return Setting{}, err
	}
	if v, ok := args[name]; ok {
		return Setting{v, "args"}, nil
	}
	if v, ok := w.Env[f.Env]; ok {
		return Setting{v, "env " + f.Env}, nil
	}
	return Setting{f.Default, "default"}, nil
}

// ParseArgs parses container args as Go's flag package would, returning the
// value of each flag given; an unknown flag or a positional argument is an
// error (the services refuse both).
func ParseArgs(flags FlagSet, args []string) (map[string]string, error) {
	out := map[string]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") || a == "-" || a == "--" {
			return nil, fmt.Errorf("argument %q is not a flag (the services take flags only)", a)
		}
		name := strings.TrimLeft(a, "-")
		val, hasVal := "", false
		if n, v, ok := strings.Cut(name, "="); ok {
			name, val, hasVal = n, v, true
		}
		f, ok := flags[name]
		if !ok {
			return nil, fmt.Errorf("argument %q: no flag --%s", a, name)
		}
		if !hasVal {
			if f.Type == "bool" {
				val = "true"
			} else {
				if i+1 >= len(args) {
					return nil, fmt.Errorf("argument %q: flag --%s needs a value", a, name)
				}
				i++
				val = args[i]
			}
		}
		out[name] = val
	}
	return out, nil
}

// ListenPort returns the port of a listen address and checks that it accepts
// connections from other pods (not a loopback address).
func ListenPort(addr string) (int32, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, fmt.Errorf("listen address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return 0, fmt.Errorf("listen address %q is loopback: unreachable from other pods and from the kubelet's probes", addr)
	}
	p, err := strconv.ParseInt(port, 10, 32)
	if err != nil || p < 1 || p > 65535 {
		return 0, fmt.Errorf("listen address %q: port must be 1-65535", addr)
	}
	return int32(p), nil
}

// containerPort resolves a port reference (a name or a number) against the
// containers of a pod, as the kubelet and the endpoints controller do.
func containerPort(pod *corev1.PodSpec, name string, number int32) (int32, bool) {
	for _, c := range pod.Containers {
		for _, p := range c.Ports {
			if name != "" && p.Name == name {
				return p.ContainerPort, true
			}
			if name == "" && p.ContainerPort == number {
				return p.ContainerPort, true
			}
		}
	}
	return 0, false
}

// selects reports whether every label of sel is on labels.
func selects(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// selected returns the Deployments whose pods a selector picks.
func (b Bundle) selected(ns string, sel map[string]string) []*appsv1.Deployment {
	var out []*appsv1.Deployment
	for _, d := range b.Deployments() {
		if d.Namespace == ns && selects(sel, d.Spec.Template.Labels) {
			out = append(out, d)
		}
	}
	return out
}

// namespaces lists the namespaces of the bundle's namespaced objects.
func (b Bundle) namespaces() []string {
	var ns []string
	for _, o := range b.Objects {
		if o.Kind == "Namespace" {
			continue
		}
		if !slices.Contains(ns, o.Namespace) {
			ns = append(ns, o.Namespace)
		}
	}
	slices.Sort(ns)
	return ns
}
