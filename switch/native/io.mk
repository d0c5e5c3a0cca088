# The native data plane's packet I/O and workers (xsk.c, afpacket.c, main.c): libnrio.so.
#   make -f switch/native/io.mk            against the pipeline (pipeline.h, libnrdp's sources)
#   make -f switch/native/io.mk stub       against pipeline_stub.h (L2 forwarding only)
# Needs Debian's libxdp-dev libbpf-dev (and clang for the sanitizer builds).
IO_DIR := $(dir $(lastword $(MAKEFILE_LIST)))
IO_SRC := $(IO_DIR)xsk.c $(IO_DIR)afpacket.c $(IO_DIR)main.c $(IO_DIR)bench.c
IO_HDR := $(IO_DIR)io.h $(IO_DIR)nrio.h
IO_CFLAGS ?= -std=gnu11 -O2 -g -Wall -Wextra -fPIC -march=x86-64-v2 -mpclmul
IO_LIBS := -lxdp -lbpf -lpthread

NRDP_SRC := $(IO_DIR)packet.c $(IO_DIR)pipeline.c $(IO_DIR)router.c
NRDP_HDR := $(IO_DIR)packet.h $(IO_DIR)pipeline.h $(IO_DIR)l2.h $(IO_DIR)router.h

$(IO_DIR)libnrio.so: $(IO_SRC) $(IO_HDR) $(NRDP_SRC) $(NRDP_HDR)
	$(CC) $(IO_CFLAGS) -shared -o $@ $(IO_SRC) $(NRDP_SRC) $(IO_LIBS) -lisal

$(IO_DIR)libnrio_stub.so: $(IO_SRC) $(IO_HDR) $(IO_DIR)pipeline_stub.h $(IO_DIR)l2.h
	$(CC) $(IO_CFLAGS) -DNRIO_PIPELINE_STUB -shared -o $@ $(IO_SRC) $(IO_LIBS)

stub: $(IO_DIR)libnrio_stub.so
.PHONY: stub
