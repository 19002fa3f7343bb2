package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tags.cncf.io/container-device-interface/pkg/cdi"
)

func runtimeWithSpecs(t *testing.T, files map[string]string) *runtime {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cache, _ := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	return &runtime{cdi: cache}
}

// A driver on the CDI library writes YAML specs (dra-example-driver's "common" device,
// say); a runtime reads them beside JSON ones.
func TestYAMLAndJSONSpecsResolveAlike(t *testing.T) {
	r := runtimeWithSpecs(t, map[string]string{
		"k8s.gpu.example.com-gpu_common.yaml": "---\ncdiVersion: 0.3.0\nkind: k8s.gpu.example.com/gpu\n" +
			"devices:\n  - name: common\n    containerEdits:\n      env:\n        - NODE=n1\n",
		"claim.json": `{"cdiVersion":"0.6.0","kind":"k8s.gpu.example.com/gpu","containerEdits":{"env":["CLAIM=c1"]},` +
			`"devices":[{"name":"c1-gpu-0","containerEdits":{"env":["GPU=gpu-0"]}}]}`,
		"notes.yml": "not: a spec", // neither .json nor .yaml: a runtime never reads it
	})
	env, err := r.resolveCDI([]string{"k8s.gpu.example.com/gpu=common", "k8s.gpu.example.com/gpu=c1-gpu-0"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"NODE": "n1", "CLAIM": "c1", "GPU": "gpu-0"}
	for key, value := range want {
		if env[key] != value {
			t.Errorf("env[%s] = %q, want %q (env %v)", key, env[key], value, env)
		}
	}
}

func TestADeviceTwoSpecsDefineIsUnresolvable(t *testing.T) {
	spec := `{"cdiVersion":"0.6.0","kind":"a.example.com/dev","devices":[{"name":"d0","containerEdits":{"env":["X=1"]}}]}`
	r := runtimeWithSpecs(t, map[string]string{"one.json": spec, "two.json": spec})
	_, err := r.resolveCDI([]string{"a.example.com/dev=d0"})
	if err == nil || !strings.Contains(err.Error(), "unresolvable CDI devices a.example.com/dev=d0") ||
		!strings.Contains(err.Error(), "conflicting device") {
		t.Fatalf("a conflicting device resolved, or the error does not say why: %v", err)
	}
}

func TestASpecThatDoesNotValidateIsSkippedAndNamed(t *testing.T) {
	r := runtimeWithSpecs(t, map[string]string{
		"bad.yaml": "cdiVersion: 0.6.0\nkind: no-class\ndevices:\n  - name: d0\n",
	})
	_, err := r.resolveCDI([]string{"no-class=d0"})
	if err == nil || !strings.Contains(err.Error(), "bad.yaml") {
		t.Fatalf("want the skipped spec named, got %v", err)
	}
	if env, err := r.resolveCDI(nil); err != nil || len(env) != 0 {
		t.Fatalf("no devices: %v, %v", env, err)
	}
}
