/* placeholder */
#ifndef FLOW_PLAN_H
#define FLOW_PLAN_H
#endif
