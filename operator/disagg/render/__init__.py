"""Pure rendering: a DisaggregatedDeployment spec to the child manifests, per engine and KV connector."""
