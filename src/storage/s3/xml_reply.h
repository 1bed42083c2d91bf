// S3's (and STS's) XML replies, read with libxml2: the few lookups the clients need.
#pragma once

#include <libxml/tree.h>

#include <functional>
#include <string>

namespace dcp::storage::s3 {

// A parsed reply; root() is null when the text is no XML.
struct Xml {
  explicit Xml(const std::string& text);
  ~Xml();
  Xml(const Xml&) = delete;
  Xml& operator=(const Xml&) = delete;
  const xmlNode* root() const;
  xmlDoc* doc;
};

// The first element named `name` at or under `node` and its siblings, depth first.
const xmlNode* Find(const xmlNode* node, const char* name);
std::string Text(const xmlNode* n);
// The text of the first element named `name` under `parent`; "" when there is none.
std::string ChildText(const xmlNode* parent, const char* name);
// Visits every element named `name` that is a direct child of the root.
void ForEachTop(const Xml& xml, const char* name, const std::function<void(const xmlNode*)>& fn);
// The <Code> of an <Error> reply; "" when `body` is none.
std::string ErrorCode(const std::string& body);

}  // namespace dcp::storage::s3
