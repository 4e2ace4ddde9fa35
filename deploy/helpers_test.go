package deploy

import (
	"testing"

	"github.com/baton-serving/baton/deploy/internal/manifest"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

type corev1ExecAction = corev1.ExecAction

// deployment returns the Deployment of a component.
func deployment(t *testing.T, b manifest.Bundle, comp string) *appsv1.Deployment {
	t.Helper()
	for _, d := range b.Deployments() {
		if d.Spec.Template.Labels[manifest.LabelComponent] == comp {
			return d
		}
	}
	t.Fatalf("no %s Deployment", comp)
	return nil
}

// container returns the main container of a component's Deployment.
func container(t *testing.T, b manifest.Bundle, comp string) *corev1.Container {
	t.Helper()
	d := deployment(t, b, comp)
	for i := range d.Spec.Template.Spec.Containers {
		if d.Spec.Template.Spec.Containers[i].Name == comp {
			return &d.Spec.Template.Spec.Containers[i]
		}
	}
	t.Fatalf("no %s container", comp)
	return nil
}

func configMap(t *testing.T, b manifest.Bundle, name string) *corev1.ConfigMap {
	t.Helper()
	for _, o := range b.Objects {
		if c, ok := o.Obj.(*corev1.ConfigMap); ok && c.Name == name {
			return c
		}
	}
	t.Fatalf("no ConfigMap %s", name)
	return nil
}

func service(t *testing.T, b manifest.Bundle, name string) *corev1.Service {
	t.Helper()
	for _, s := range b.Services() {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no Service %s", name)
	return nil
}
