/* -*- P4_16 -*-
 * NetReduce: in-network allreduce transparent to RDMA, the v1model program for BMv2.
 * It implements docs/pipeline.md like the software target (switch/dataplane/pipeline.py); where
 * v1model forces a difference, switch/p4/README.md says so. Limits: limits.p4.
 *
 * Build: p4c --target bmv2 --arch v1model --p4runtime-files build/p4/netreduce.p4info.txtpb
 *            -o build/p4 switch/p4/netreduce.p4        (python -m switch.p4.program does it)
 */
#include <core.p4>
#include <v1model.p4>

#include "limits.p4"
#include "headers.p4"
#include "state.p4"
#include "parser.p4"
#include "ingress.p4"
#include "egress.p4"
#include "deparser.p4"

V1Switch(NrParser(), NrVerifyChecksum(), NrIngress(), NrEgress(), NrComputeChecksum(),
         NrDeparser()) main;
