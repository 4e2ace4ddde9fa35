package manifest

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	kusttypes "sigs.k8s.io/kustomize/api/types"
)

func TestDecode(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		kinds   []string
		wantErr string
	}{
		{"two documents and a comment-only one", `
# only a comment
---
apiVersion: v1
kind: ConfigMap
metadata: {name: a}
data: {K: v}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: c, image: i}]
`, []string{"ConfigMap", "Deployment"}, ""},
		{"kustomization", "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [a.yaml]\n",
			[]string{"Kustomization"}, ""},
		{"component", "apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\nresources: [a.yaml]\n",
			[]string{"Component"}, ""},
		{"unknown field", `
apiVersion: v1
kind: Service
metadata: {name: s}
spec:
  clusterIp: None
`, nil, `unknown field "spec.clusterIp"`},
		{"field with the wrong case", `
apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
spec:
  Replicas: 2
`, nil, `unknown field "spec.Replicas"`},
		{"duplicate key", `
apiVersion: v1
kind: ConfigMap
metadata: {name: a}
data:
  K: one
  K: two
`, nil, `already set`},
		{"unquoted number in ConfigMap data", `
apiVersion: v1
kind: ConfigMap
metadata: {name: a}
data:
  BATON_PAGE_SIZE: 16
`, nil, "cannot unmarshal number"},
		{"unknown kustomization field", "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresource: [a.yaml]\n",
			nil, `unknown field "resource"`},
		{"YAML 1.1 boolean where a string belongs", `
apiVersion: v1
kind: Service
metadata:
  name: s
  labels: {enabled: yes}
`, nil, "cannot unmarshal bool"},
		{"kind not checked", "apiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\n", nil, `unsupported apiVersion "batch/v1" kind "Job"`},
		{"no name", "apiVersion: v1\nkind: ConfigMap\ndata: {}\n", nil, "no metadata.name"},
		{"not YAML", "apiVersion: v1\nkind: [\n", nil, "test.yaml#1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := Decode("test.yaml", []byte(tc.yaml))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var kinds []string
			for _, o := range objs {
				kinds = append(kinds, o.Kind)
			}
			if strings.Join(kinds, ",") != strings.Join(tc.kinds, ",") {
				t.Fatalf("kinds = %v, want %v", kinds, tc.kinds)
			}
		})
	}
}

func TestDecodeTypes(t *testing.T) {
	objs, err := Decode("t", []byte(`
apiVersion: apps/v1
kind: Deployment
metadata: {name: d, namespace: ns1}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
        - name: c
          image: i
          resources: {limits: {memory: 2Gi}}
---
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: ns1
replicas: [{name: d, count: 2}]
`))
	if err != nil {
		t.Fatal(err)
	}
	d := objs[0].Obj.(*appsv1.Deployment)
	if *d.Spec.Replicas != 3 || objs[0].Namespace != "ns1" || objs[0].Source != "t#1" {
		t.Errorf("decoded %+v from %s", objs[0], objs[0].Source)
	}
	if m := d.Spec.Template.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory]; m.Value() != 2<<30 {
		t.Errorf("memory limit = %v", m.String())
	}
	k := objs[1].Obj.(*kusttypes.Kustomization)
	if k.Namespace != "ns1" || len(k.Replicas) != 1 || k.Replicas[0].Count != 2 {
		t.Errorf("kustomization = %+v", k)
	}
}
