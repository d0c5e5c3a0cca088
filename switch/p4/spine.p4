/* -*- P4_16 -*-
 * NetReduce: the SPINE role of a two-tier fabric (docs/multirack.md), the v1model program
 * for BMv2. It implements switch/dataplane/spine.py (SpinePipeline) from the single switch's
 * files compiled with NR_ROLE_SPINE (headers, parser, state, payload macros, deparser) and
 * the spine's own controls; where v1model forces a difference, switch/p4/README.md says so.
 * Limits: limits.p4 (NR_MAX_LANES ToRs per ring, 256 B payloads, one carried header).
 *
 * Build: p4c --target bmv2 --arch v1model --p4runtime-files build/p4-spine/spine.p4info.txtpb
 *            -o build/p4-spine switch/p4/spine.p4   (python -m switch.p4.program --spine)
 */
#define NR_ROLE_SPINE

#include <core.p4>
#include <v1model.p4>

#include "limits.p4"
#include "headers.p4"
#include "spine_state.p4"
#include "parser.p4"
#include "spine_ingress.p4"
#include "spine_egress.p4"
#include "deparser.p4"

V1Switch(NrParser(), NrVerifyChecksum(), NrSpineIngress(), NrSpineEgress(),
         NrComputeChecksum(), NrDeparser()) main;
