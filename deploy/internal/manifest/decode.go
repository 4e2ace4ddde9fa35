// Package manifest reads Baton's Kubernetes manifests the way the API server
// would — every document decoded into its typed Kubernetes API object, with
// unknown or duplicate fields as errors — renders kustomizations with
// kustomize itself, and checks that the rendered objects agree with the
// binaries they run: flags, listen ports, probes, Services and drain times.
package manifest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/kustomize/api/krusty"
	kusttypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// Object is one decoded document.
type Object struct {
	Source     string // file and document number, for error messages
	APIVersion string
	Kind       string
	Name       string
	Namespace  string
	// Obj is the typed object: *appsv1.Deployment, *corev1.Service,
	// *corev1.ConfigMap, *corev1.Namespace, *policyv1.PodDisruptionBudget, or
	// *kusttypes.Kustomization for a Kustomization or Component.
	Obj any
}

// String names the object for error messages.
func (o Object) String() string {
	return fmt.Sprintf("%s %s (%s)", o.Kind, o.Name, o.Source)
}

// kinds lists the types a manifest may hold, by apiVersion and kind. A kind
// missing here is an error rather than skipped, so that nothing escapes the
// strict decoding.
var kinds = map[[2]string]func() any{
	{"v1", "ConfigMap"}:                  func() any { return new(corev1.ConfigMap) },
	{"v1", "Namespace"}:                  func() any { return new(corev1.Namespace) },
	{"v1", "Service"}:                    func() any { return new(corev1.Service) },
	{"apps/v1", "Deployment"}:            func() any { return new(appsv1.Deployment) },
	{"policy/v1", "PodDisruptionBudget"}: func() any { return new(policyv1.PodDisruptionBudget) },
	{kusttypes.KustomizationVersion, kusttypes.KustomizationKind}: func() any { return new(kusttypes.Kustomization) },
	{kusttypes.ComponentVersion, kusttypes.ComponentKind}:         func() any { return new(kusttypes.Kustomization) },
}

// Decode decodes every document of a YAML stream. Empty documents (only
// comments) are skipped; anything else must be an object of a known kind
// whose every field exists in the Kubernetes API type, named with the exact
// case, and given once.
func Decode(source string, data []byte) ([]Object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var objs []Object
	var errs []error
	for i := 1; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", source, i, err)
		}
		src := fmt.Sprintf("%s#%d", source, i)
		o, ok, err := decodeDoc(src, doc)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if ok {
			objs = append(objs, o)
		}
	}
	return objs, errors.Join(errs...)
}

func decodeDoc(src string, doc []byte) (Object, bool, error) {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return Object{}, false, fmt.Errorf("%s: %w", src, err)
	}
	if t := bytes.TrimSpace(j); len(t) == 0 || string(t) == "null" {
		return Object{}, false, nil
	}
	var tm metav1.TypeMeta
	if err := kjson.UnmarshalCaseSensitivePreserveInts(j, &tm); err != nil {
		return Object{}, false, fmt.Errorf("%s: not an object: %w", src, err)
	}
	newObj, ok := kinds[[2]string{tm.APIVersion, tm.Kind}]
	if !ok {
		return Object{}, false, fmt.Errorf("%s: unsupported apiVersion %q kind %q (add it to manifest.kinds to check it)", src, tm.APIVersion, tm.Kind)
	}
	obj := newObj()
	strict, err := kjson.UnmarshalStrict(j, obj)
	if err != nil {
		return Object{}, false, fmt.Errorf("%s: %s: %w", src, tm.Kind, err)
	}
	if len(strict) > 0 {
		return Object{}, false, fmt.Errorf("%s: %s: %w", src, tm.Kind, errors.Join(strict...))
	}
	o := Object{Source: src, APIVersion: tm.APIVersion, Kind: tm.Kind, Obj: obj}
	if m, ok := obj.(metav1.Object); ok {
		o.Name, o.Namespace = m.GetName(), m.GetNamespace()
		if o.Name == "" {
			return Object{}, false, fmt.Errorf("%s: %s has no metadata.name", src, tm.Kind)
		}
	}
	return o, true, nil
}

// DecodeFile decodes one YAML file.
func DecodeFile(path string) ([]Object, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Decode(path, data)
}

// DecodeTree decodes every .yaml and .yml file under root.
func DecodeTree(root string) (map[string][]Object, error) {
	out := map[string][]Object{}
	var errs []error
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || !(strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
			return nil
		}
		objs, err := DecodeFile(path)
		if err != nil {
			errs = append(errs, err)
		}
		out[path] = objs
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, errors.Join(errs...)
}

// Render runs kustomize on the kustomization in dir, as `kubectl apply -k`
// would, and decodes the result strictly.
func Render(dir string) ([]Object, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	data, err := rm.AsYaml()
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	return Decode("kustomize build "+dir, data)
}
