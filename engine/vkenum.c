// Lists Vulkan physical devices without linking Vulkan: the plain CPU build
// must not need libvulkan, and ggml-vulkan hides CPU-type devices (Mesa's
// lavapipe) unless GGML_VK_VISIBLE_DEVICES names them, so the engine needs
// the list (and which entries are software) before it loads the backend.
// Only the handful of core entry points and the leading fields of the
// structures are declared here; their layout is fixed by the Vulkan ABI.
#include <stdint.h>
#include <string.h>
#include "vkenum.h"

#ifdef _WIN32
#include <windows.h>
#define MP_VK_LIB "vulkan-1.dll"
static void *mp_dlopen(const char *name) { return (void *)LoadLibraryA(name); }
static void *mp_dlsym(void *lib, const char *sym) { return (void *)GetProcAddress((HMODULE)lib, sym); }
static void mp_dlclose(void *lib) { FreeLibrary((HMODULE)lib); }
#else
#include <dlfcn.h>
#define MP_VK_LIB "libvulkan.so.1"
static void *mp_dlopen(const char *name) { return dlopen(name, RTLD_NOW | RTLD_LOCAL); }
static void *mp_dlsym(void *lib, const char *sym) { return dlsym(lib, sym); }
static void mp_dlclose(void *lib) { dlclose(lib); }
#endif

typedef struct {
	int32_t sType; // VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO = 1
	const void *pNext;
	uint32_t flags;
	const void *pApplicationInfo;
	uint32_t enabledLayerCount;
	const char *const *ppEnabledLayerNames;
	uint32_t enabledExtensionCount;
	const char *const *ppEnabledExtensionNames;
} mp_VkInstanceCreateInfo;

// The leading fields of VkPhysicalDeviceProperties; the whole structure is
// under 1 KiB (limits and sparse properties follow), props_buf holds it.
typedef struct {
	uint32_t apiVersion, driverVersion, vendorID, deviceID;
	int32_t deviceType;
	char deviceName[256];
} mp_VkPhysicalDevicePropertiesHead;

typedef int32_t (*create_fn)(const mp_VkInstanceCreateInfo *, const void *, void **);
typedef void (*destroy_fn)(void *, const void *);
typedef int32_t (*enum_fn)(void *, uint32_t *, void **);
typedef void (*props_fn)(void *, void *);

int mp_vk_enumerate(mp_vk_device *out, int cap) {
	void *lib = mp_dlopen(MP_VK_LIB);
	if (!lib) {
		return -1;
	}
	create_fn create = (create_fn)mp_dlsym(lib, "vkCreateInstance");
	destroy_fn destroy = (destroy_fn)mp_dlsym(lib, "vkDestroyInstance");
	enum_fn enumerate = (enum_fn)mp_dlsym(lib, "vkEnumeratePhysicalDevices");
	props_fn props = (props_fn)mp_dlsym(lib, "vkGetPhysicalDeviceProperties");
	if (!create || !destroy || !enumerate || !props) {
		mp_dlclose(lib);
		return -1;
	}
	mp_VkInstanceCreateInfo ci;
	memset(&ci, 0, sizeof ci);
	ci.sType = 1;
	void *inst = NULL;
	if (create(&ci, NULL, &inst) != 0 || !inst) {
		mp_dlclose(lib);
		return -2;
	}
	void *devs[64];
	uint32_t n = 64;
	int32_t rc = enumerate(inst, &n, devs);
	if (rc < 0) { // VK_INCOMPLETE (5) still fills n entries
		destroy(inst, NULL);
		mp_dlclose(lib);
		return -2;
	}
	int k = 0;
	for (uint32_t i = 0; i < n && k < cap; i++) {
		_Alignas(16) unsigned char props_buf[4096];
		memset(props_buf, 0, sizeof props_buf);
		props(devs[i], props_buf);
		const mp_VkPhysicalDevicePropertiesHead *p = (const void *)props_buf;
		memcpy(out[k].name, p->deviceName, sizeof out[k].name);
		out[k].name[sizeof out[k].name - 1] = 0;
		out[k].type = p->deviceType;
		k++;
	}
	destroy(inst, NULL);
	// libvulkan stays loaded: ggml-vulkan loads it next, and unloading
	// Vulkan drivers is where they are least tested.
	return k;
}
