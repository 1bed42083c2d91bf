// One encoding of a rank's status on the wire (a code byte, then the message or payload), for
// every collective that must also agree on failure: AgreeOnStatus (dcp/comm.h) and these.
// Messages that carry either a payload or a rank's error, so one collective both exchanges
// data and agrees on failure: if any rank failed, every rank returns that rank's error.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "dcp/comm.h"

namespace dcp {

std::string TagOk(std::string_view payload);
std::string TagError(const Status& s);

// The payloads of `gathered` (one per rank), or the first failing rank's error as
// "rank R: ..." (no prefix in a world of one).
Result<std::vector<std::string_view>> UntagAll(const std::vector<std::string>& gathered);

// All-gathers `mine` (or this rank's error when !mine_status.ok()); returns every rank's
// payload, or the first failing rank's error on every rank.
Result<std::vector<std::string>> AllGatherOrFail(Comm& comm, const Status& mine_status,
                                                 std::string_view mine);

// `root`'s payload, or its error (`root_status`), reaches every rank.
Result<std::string> BroadcastOrFail(Comm& comm, int root, const Status& root_status,
                                    std::string_view payload);

// `root`'s status reaches every rank.
Status BroadcastStatus(Comm& comm, int root, const Status& s);

}  // namespace dcp
