// A stand-in for Windows' bcryptprimitives.dll, for Wine 8.0 (Debian 12)
// only: Go 1.24 and later call its ProcessPrng at start (present on
// Windows 10 and later), which Wine added after 8.0; without it a Go
// program under Wine dies with "bcryptprimitives.dll not found".
// scripts/wine/prefix.sh builds it into the test prefix's system32. It is
// test harness, never shipped: real Windows has its own.
#include <windows.h>
#include <bcrypt.h>

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {
	while (len > 0) {
		ULONG n = len > 0x40000000 ? 0x40000000 : (ULONG)len;
		if (BCryptGenRandom(NULL, data, n, BCRYPT_USE_SYSTEM_PREFERRED_RNG) != 0) {
			return FALSE;
		}
		data += n;
		len -= n;
	}
	return TRUE;
}
