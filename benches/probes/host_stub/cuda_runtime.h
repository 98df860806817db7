// Stands in for CUDA's runtime header in host translation units that run kernel headers under
// benches/probes/host_simt.h, which provides what those headers take from it. Put this folder
// on the include path (-Ibenches/probes/host_stub) only there.
#pragma once
