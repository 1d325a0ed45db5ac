#ifndef MESHP2P_CPUCHECK_H
#define MESHP2P_CPUCHECK_H
// The CPU extensions this build was compiled to use ("" for the baseline),
// each followed by a space; a process whose CPU lacks one exits at start
// (cpucheck.c).
const char *mp_cpu_needs(void);
#endif
