/* fake_driver.h — a simulated one-device CUDA driver for CPU tests (see fake_driver.c). */
#ifndef FERRY_FAKE_DRIVER_H
#define FERRY_FAKE_DRIVER_H
#include "internal.h"
void fake_driver_use(void);
extern int fake_live_events, fake_live_streams, fake_live_devmem, fake_registered;
#endif
