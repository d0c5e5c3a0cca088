/* -*- P4_16 -*-
 * NetReduce: the TOR role of a two-tier fabric (docs/multirack.md), the v1model program for
 * BMv2. It implements switch/dataplane/tor.py (TorPipeline, RackPool) from the single
 * switch's files compiled with NR_ROLE_TOR (headers, parser, state, the checks, the
 * contribution, the result rebuild and the whole single-switch egress, deparser), the
 * inter-switch message's (iscrc.p4, interswitch.p4) and the ToR's own controls; where
 * v1model forces a difference, switch/p4/README.md says so. Limits: limits.p4 (256 B
 * payloads, one leaving and one entering connection per ring: contiguous racks).
 *
 * Build: p4c --target bmv2 --arch v1model --p4runtime-files build/p4-tor/tor.p4info.txtpb
 *            -o build/p4-tor switch/p4/tor.p4   (python -m switch.p4.program --tor)
 */
#define NR_ROLE_TOR

#include <core.p4>
#include <v1model.p4>

#include "limits.p4"
#include "headers.p4"
#include "tor_state.p4"
#include "parser.p4"
#include "tor_ingress.p4"
#include "tor_egress.p4"
#include "deparser.p4"

V1Switch(NrParser(), NrVerifyChecksum(), NrTorIngress(), NrTorEgress(),
         NrComputeChecksum(), NrDeparser()) main;
