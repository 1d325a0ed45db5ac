#ifndef MESHP2P_VKENUM_H
#define MESHP2P_VKENUM_H

// mp_vk_device is one Vulkan physical device as the system's Vulkan loader
// lists it, in the loader's order (ggml-vulkan's device indices).
typedef struct {
	char name[256];
	int  type; // VkPhysicalDeviceType: 1 integrated, 2 discrete, 3 virtual, 4 CPU
} mp_vk_device;

// mp_vk_enumerate lists up to cap physical devices through libvulkan.so.1,
// opened with dlopen (the binary does not link Vulkan). It returns how
// many it found, -1 when there is no Vulkan loader, -2 when it has no
// usable instance.
int mp_vk_enumerate(mp_vk_device *out, int cap);
#endif
