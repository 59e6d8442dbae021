// KServe's module, for its CRDs only (config/crd/full): the plane test of the pipeline's deploy step
// installs the InferenceService CRD so that the apiserver validates what the step creates.
// Test-only: nothing is built from it, nothing goes into an image.
module github.com/edl/edl/tools/kserve

go 1.26.0

require github.com/kserve/kserve v0.16.0
