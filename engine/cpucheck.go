package engine

/*
#include "cpucheck.h"
*/
import "C"

import "strings"

// CPUNeeds lists the instruction set extensions this build was compiled
// to use beyond its architecture's baseline (e.g. avx avx2 fma bmi2 for
// -march=x86-64-v3; empty for the baseline). A CPU that lacks one is
// refused before anything runs (cpucheck.c), so a running process has
// them all.
func CPUNeeds() []string { return strings.Fields(C.GoString(C.mp_cpu_needs())) }
