// Loads an EndpointPickerConfig with the Gateway API Inference Extension's own config loader (the one the
// llm-d inference scheduler's EPP runs at start, cmd/epp/runner/runner.go parseConfigurationPhaseOne):
// strict decoding into the v1alpha1 API, static defaults, feature-gate validation. Prints the loaded
// config as JSON, or REFUSED and the loader's error.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/go-logr/logr"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/config/loader"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datalayer"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol"
)

func main() {
	data, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Println("ERROR:", err)
		os.Exit(2)
	}
	loader.RegisterFeatureGate(datalayer.ExperimentalDatalayerFeatureGate)
	loader.RegisterFeatureGate(flowcontrol.FeatureGate)
	loader.RegisterFeatureGate(datalayer.PrepareDataPluginsFeatureGate)
	raw, gates, err := loader.LoadRawConfig(data, logr.Discard())
	if err != nil {
		fmt.Println("REFUSED:", err)
		os.Exit(1)
	}
	out, _ := json.Marshal(map[string]any{"config": raw, "gates": gates})
	fmt.Println(string(out))
}
